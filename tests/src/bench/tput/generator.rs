//! The frame generator `xlb_bench_gen` from userspace: loading it next to
//! the programs it feeds, choosing its template and target, and running it
//! in live-frames mode.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use aya::{
    TestRun as _,
    maps::{Array, Map, MapData, PerCpuArray, PerCpuValues, ProgramArray},
    programs::{TestRunAttrs, TestRunOptions, Xdp},
    util::nr_cpus,
};
use lb_common::bench::{
    BENCH_FRAME_LEN, BenchGen, MAP_BENCH_GEN, MAP_BENCH_PROG, MAP_BENCH_SEQ, PROG_BENCH_DROP,
    PROG_BENCH_GEN,
};
use lb_user::dataplane::Dataplane;

/// The generator's maps, found through the loaded program (the data plane
/// keeps its own maps; these stay in its object untouched by the daemon).
pub struct Generator {
    config: Array<MapData, BenchGen>,
    slot: ProgramArray<MapData>,
    seq: PerCpuArray<MapData, u64>,
}

/// Loads `name` unless it is loaded already (a shared fixture world keeps
/// its programs across tests).
fn ensure_loaded(dp: &mut Dataplane, name: &'static str) -> anyhow::Result<()> {
    let prog = dp.program::<Xdp>(name)?;
    if prog.fd().is_err() {
        prog.load()
            .with_context(|| format!("loading {name} (verifier)"))?;
    }
    Ok(())
}

impl Generator {
    /// Loads `xlb_bench_gen` and `xlb_bench_drop` into the kernel and opens
    /// the generator's three maps by their ids.
    pub fn new(dp: &mut Dataplane) -> anyhow::Result<Self> {
        ensure_loaded(dp, PROG_BENCH_GEN)?;
        ensure_loaded(dp, PROG_BENCH_DROP)?;
        let ids = dp
            .program::<Xdp>(PROG_BENCH_GEN)?
            .info()?
            .map_ids()?
            .context("the kernel does not list the generator's maps (kernel older than 4.15?)")?;
        let mut maps = Vec::new();
        for id in ids {
            let data = MapData::from_id(id)?;
            let name = data.info()?.name_as_str().unwrap_or_default().to_string();
            maps.push((name, data));
        }
        let mut take = |want: &str| -> anyhow::Result<Map> {
            let i = maps
                .iter()
                .position(|(n, _)| n == want)
                .with_context(|| format!("{PROG_BENCH_GEN} uses no map {want} (build mismatch)"))?;
            Ok(Map::from_map_data(maps.swap_remove(i).1)?)
        };
        Ok(Self {
            config: take(MAP_BENCH_GEN)?.try_into()?,
            slot: take(MAP_BENCH_PROG)?.try_into()?,
            seq: take(MAP_BENCH_SEQ)?.try_into()?,
        })
    }

    /// Every frame becomes `frame` (with a new source per frame if `flags`
    /// has `GEN_MANY_SOURCES`), then goes to `target`.
    pub fn set(
        &mut self,
        dp: &mut Dataplane,
        target: &'static str,
        frame: &[u8],
        flags: u32,
    ) -> anyhow::Result<()> {
        let frame: [u8; BENCH_FRAME_LEN] = frame.try_into().with_context(|| {
            format!(
                "the generator's template is {BENCH_FRAME_LEN} bytes, not {}",
                frame.len()
            )
        })?;
        self.config.set(
            0,
            BenchGen {
                frame,
                flags,
                _pad: 0,
            },
            0,
        )?;
        let fd = dp.program::<Xdp>(target)?.fd()?;
        self.slot.set(0, fd, 0)?;
        Ok(())
    }

    /// Sets every CPU's new-source counter to `n`: the next frame with
    /// `GEN_MANY_SOURCES` gets `lb_common::bench::gen_source(n)`.
    pub fn start_sources_at(&mut self, n: u64) -> anyhow::Result<()> {
        let values = PerCpuValues::try_from(vec![n; nr_cpus().map_err(|(_, e)| e)?])?;
        self.seq.set(0, values, 0)?;
        Ok(())
    }
}

/// Runs the generator over `frames` frames in live-frames mode, arriving on
/// `ifindex` (of the calling thread's namespace), `batch` frames per kernel
/// batch; returns the wall time of the call.
pub fn live_run(
    dp: &mut Dataplane,
    ifindex: u32,
    frames: u32,
    batch: u32,
) -> anyhow::Result<Duration> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, ...; the
    // generator writes the real frame, this is only its length.
    let data = [0u8; BENCH_FRAME_LEN];
    let md: [u32; 6] = [0, BENCH_FRAME_LEN as u32, 0, ifindex, 0, 0];
    let ctx: Vec<u8> = md.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let prog = dp.program::<Xdp>(PROG_BENCH_GEN)?;
    let t = Instant::now();
    prog.test_run(TestRunOptions {
        data_in: Some(&data),
        ctx_in: Some(&ctx),
        repeat: frames,
        attrs: TestRunAttrs::new().xdp_live_frames(batch),
        ..Default::default()
    })
    .context("BPF_PROG_TEST_RUN (live frames) of the generator")?;
    Ok(t.elapsed())
}
