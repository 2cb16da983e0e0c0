//! What a group of figures measures, printed under its heading in the
//! summary: a figure whose meaning is not in its name alone (what starts
//! and stops the clock) says it here, with its goal. Groups not listed
//! print no note.

/// (group as recorded, what it measures and the goal).
const NOTES: &[(&str, &str)] = &[
    (
        "cluster: node death to last connection flowing",
        "From the moment node A dies (killed, its link silenced, or `xlb withdraw --all`) to \
         the moment the last of the held connections through it answers again through node B, \
         on the same backend; median and spread over the rounds. Goal: <= 1000 ms with BFD at \
         100 ms x 3. A silent link with BIRD's defaults is not run: it waits the 240 s hold time.",
    ),
    (
        "cluster: backend change to route change on the router",
        "From a node's backend transition that makes a VIP (un)servable (the daemon's event \
         time) to the router's kernel route losing or gaining that node as a next hop \
         (`ip monitor route` in the router's namespace); median and maximum of every node's \
         changes over the cycles. Goal: <= 100 ms.",
    ),
];

/// The note of `group`, if it has one.
pub(crate) fn about(group: &str) -> Option<&'static str> {
    NOTES.iter().find(|(g, _)| *g == group).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_name_their_goal() {
        for (group, note) in NOTES {
            assert!(note.contains("Goal: "), "{group}: {note}");
            assert_eq!(about(group), Some(*note));
        }
        assert_eq!(about("per packet"), None);
    }
}
