//! CUDA graphs of the decode step: the launches of one forward are captured once per
//! [`GraphKey`] (decode batch size, logit rows) and replayed for every later forward with that
//! key. Kernels read token ids, positions, KV slots and block tables from the batch's persistent
//! device buffers, so a replay computes the new step without re-recording anything.
//! `FAK_CUDA_GRAPHS=0` turns capture off (every forward launches its kernels one by one).

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::device::{drv, Device};
use crate::backend::GraphKey;
use crate::Result;

/// An instantiated graph.
pub(crate) struct Exec(sys::CUgraphExec);

impl Exec {
    /// Replays the graph on fak's stream.
    pub(crate) fn launch(&self, dev: &Device) -> Result<()> {
        dev.bind()?;
        // SAFETY: valid exec and stream.
        drv("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.0, dev.stream) })
    }
}

/// Captures the launches `f` queues on fak's stream into a graph (not run).
pub(crate) fn capture(dev: &Device, f: &mut dyn FnMut() -> Result<()>) -> Result<Exec> {
    dev.bind()?;
    // SAFETY: capture on fak's own stream; relaxed mode so that lazily allocated workspaces
    // (cuMemAlloc) may be created inside the first forward.
    drv("cuStreamBeginCapture", unsafe { sys::cuStreamBeginCapture_v2(dev.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) })?;
    let r = f();
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above (always, also after an error in `f`).
    let end = drv("cuStreamEndCapture", unsafe { sys::cuStreamEndCapture(dev.stream, &mut graph) });
    let destroy = |g: sys::CUgraph| {
        if !g.is_null() {
            // SAFETY: graph from the capture, destroyed once.
            unsafe {
                let _ = sys::cuGraphDestroy(g);
            }
        }
    };
    if let Err(e) = r.and(end) {
        destroy(graph);
        return Err(e);
    }
    let mut exec = std::ptr::null_mut();
    // SAFETY: valid graph; flags 0.
    let inst = drv("cuGraphInstantiate", unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) });
    destroy(graph);
    inst?;
    Ok(Exec(exec))
}

// SAFETY: an instantiated graph is an immutable handle used under the device's context.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: created by cuGraphInstantiate; destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.0);
        }
    }
}

/// Captured decode graphs, by key.
pub struct Graphs {
    pub enabled: bool,
    execs: Mutex<HashMap<GraphKey, Exec>>,
}

impl Graphs {
    /// Graph capture on unless `FAK_CUDA_GRAPHS` is `0`/`off`/`false`.
    pub fn from_env() -> Graphs {
        let enabled = !matches!(std::env::var("FAK_CUDA_GRAPHS").as_deref().map(str::to_ascii_lowercase).as_deref(), Ok("0" | "off" | "false" | "no"));
        Graphs { enabled, execs: Mutex::new(HashMap::new()) }
    }

    /// Number of graphs captured so far.
    pub fn len(&self) -> usize {
        self.execs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the forward `f` under `key`: replays its graph, or captures it first.
    pub fn run(&self, dev: &Device, key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let Some(key) = key.filter(|_| self.enabled) else { return f() };
        dev.bind()?;
        if let Some(e) = self.execs.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            // SAFETY: valid exec and stream.
            return drv("cuGraphLaunch", unsafe { sys::cuGraphLaunch(e.0, dev.stream) });
        }
        let exec = capture(dev, f)?;
        exec.launch(dev)?;
        self.execs.lock().unwrap_or_else(|e| e.into_inner()).insert(key, exec);
        Ok(())
    }
}
