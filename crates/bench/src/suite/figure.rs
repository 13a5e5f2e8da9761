//! What a workload measures: one figure of one round on one peer.

/// One figure of one round on one peer, as a workload measured it.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured ("creates/s in the interval").
    pub metric: String,
    /// Its unit ("files/s", "µs/op", "s").
    pub unit: &'static str,
    /// Rates (higher is better) or times (lower is better).
    pub higher_better: bool,
    /// The point on a curve (threads, directory size, file blocks).
    pub x: Option<f64>,
    /// A library-only variant shown as a peer of its own ("i_mutex":
    /// the locked baseline; "shared-fd-table").
    pub variant: Option<&'static str>,
    /// The value.
    pub value: f64,
}
