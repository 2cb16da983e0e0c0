//! Every key the configuration file accepts, read from the raw structs'
//! own `Deserialize` implementations, so the list cannot drift from what
//! the parser takes: `examples/xlb.toml` and the README are checked against
//! it (`tests/tests/docs.rs`).
//!
//! serde has no reflection, but a derived `Deserialize` for a struct hands
//! its deserializer the struct's name and every field name it accepts
//! (`deserialize_struct(name, fields, visitor)`). [`Probe`] is a
//! deserializer that walks one path of keys into the document (`vip`, then
//! `backend`, then `health_check`) and reports what it finds at its end: a
//! table with its fields, or a value. Running it once per path, breadth
//! first, lists every table and key. A probe never builds a value: at the
//! end of its path it stops with an error, which is expected and ignored.

use std::cell::RefCell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess};

use super::raw::RawConfig;

/// One key of the configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigKey {
    /// Dotted path from the top of the file, arrays of tables without
    /// brackets: `daemon.interface`, `vip.backend.health_check.kind`.
    pub path: String,
    /// Rust name of the table type that holds the key (`RawHealth` for
    /// `health_check.kind`, `vip.health_check.kind` and
    /// `vip.backend.health_check.kind` alike): keys of one type are one
    /// setting, documented once.
    pub parent_type: &'static str,
    /// The key's value is a table (or an array of tables) rather than a
    /// value.
    pub table: bool,
}

impl ConfigKey {
    /// The last part of the path: the key as written in its table.
    pub fn name(&self) -> &str {
        self.path.rsplit('.').next().unwrap_or(&self.path)
    }
}

/// Every key the configuration accepts, tables first at each level, in the
/// order the raw structs declare them.
pub fn accepted_keys() -> Vec<ConfigKey> {
    let mut keys = Vec::new();
    let mut queue = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let Found::Table { name, fields } = probe(&path) else {
            continue;
        };
        for &field in fields {
            let mut child = path.clone();
            child.push(field);
            let table = matches!(probe(&child), Found::Table { .. });
            keys.push(ConfigKey {
                path: child.join("."),
                parent_type: name,
                table,
            });
            if table {
                queue.push(child);
            }
        }
    }
    keys.sort_by(|a, b| a.path.cmp(&b.path));
    keys
}

/// What a probe found at the end of its path.
#[derive(Clone, Copy, Debug, Default)]
enum Found {
    /// The path does not exist (a key that is not a table was walked into).
    #[default]
    Nothing,
    /// A value: not a table.
    Value,
    /// A table of this type with these keys.
    Table {
        name: &'static str,
        fields: &'static [&'static str],
    },
}

fn probe(path: &[&'static str]) -> Found {
    let found = RefCell::new(Found::Nothing);
    // The error is the probe stopping at the end of its path.
    let _ = RawConfig::deserialize(Probe {
        path,
        found: &found,
    });
    found.into_inner()
}

/// The deserializer that walks `path` (see the module comment).
#[derive(Clone, Copy)]
struct Probe<'a> {
    path: &'a [&'static str],
    found: &'a RefCell<Found>,
}

#[derive(Debug)]
struct Stop(String);

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Stop(msg.to_string())
    }
}

impl Probe<'_> {
    /// Anything but a table, an option or an array: a value if the path
    /// ends here, else the path does not exist.
    fn value<T>(self) -> Result<T, Stop> {
        if self.path.is_empty() {
            *self.found.borrow_mut() = Found::Value;
        }
        Err(Stop("a value".to_owned()))
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        self.value()
    }

    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        match self.path.split_first() {
            None => {
                *self.found.borrow_mut() = Found::Table { name, fields };
                Err(Stop("a table".to_owned()))
            }
            Some((key, rest)) if fields.contains(key) => visitor.visit_map(OneKey {
                key: Some(key),
                value: Probe {
                    path: rest,
                    found: self.found,
                },
            }),
            Some(_) => Err(Stop("no such key".to_owned())),
        }
    }

    fn deserialize_option<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        // An array of tables (`[[vip]]`) is walked through its one element;
        // an array of values is a value.
        visitor.visit_seq(OneElement(Some(self)))
    }

    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.value()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct tuple tuple_struct map identifier
        ignored_any
    }
}

/// A table with the one key the probe walks into.
struct OneKey<'a> {
    key: Option<&'static str>,
    value: Probe<'a>,
}

impl<'de> MapAccess<'de> for OneKey<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        self.key
            .take()
            .map(|k| seed.deserialize(k.into_deserializer()))
            .transpose()
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Stop> {
        seed.deserialize(self.value)
    }
}

/// An array with one element, the probe itself.
struct OneElement<'a>(Option<Probe<'a>>);

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Stop;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Stop> {
        self.0.take().map(|p| seed.deserialize(p)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'k>(keys: &'k [ConfigKey], path: &str) -> Option<&'k ConfigKey> {
        keys.iter().find(|k| k.path == path)
    }

    #[test]
    fn lists_keys_at_every_depth() {
        let keys = accepted_keys();
        let cases = [
            ("daemon", "RawConfig", true),
            ("daemon.interface", "RawDaemon", false),
            ("vip", "RawConfig", true),
            ("vip.backend", "RawVip", true),
            ("vip.backend.max_flows", "RawBackend", false),
            ("vip.backend.health_check.via", "RawHealth", false),
            ("vip.guard.deny.prefix", "RawListRule", false),
            ("guard.auto_block.for", "RawAutoBlock", false),
            ("health_check.expect_status", "RawHealth", false),
            ("cluster.peers", "RawCluster", false),
            ("announce.speaker_socket", "RawAnnounce", false),
        ];
        for (path, parent_type, table) in cases {
            let want = ConfigKey {
                path: path.to_owned(),
                parent_type,
                table,
            };
            assert_eq!(find(&keys, path), Some(&want), "{path}");
        }
        assert_eq!(find(&keys, "guard.auto_block.for").unwrap().name(), "for");
    }

    #[test]
    fn one_table_type_is_listed_at_each_place_it_is_used() {
        let keys = accepted_keys();
        let health: Vec<&str> = keys
            .iter()
            .filter(|k| k.path.ends_with("health_check") && k.table)
            .map(|k| k.path.as_str())
            .collect();
        assert_eq!(
            health,
            [
                "health_check",
                "vip.backend.health_check",
                "vip.health_check"
            ]
        );
        let kinds = keys.iter().filter(|k| k.name() == "kind").count();
        assert_eq!(kinds, 3);
        assert!(find(&keys, "daemon.nope").is_none());
        assert!(find(&keys, "daemon.interface.x").is_none());
    }
}
