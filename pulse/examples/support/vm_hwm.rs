//! Peak resident memory of this process, for the benchmark examples.

/// `VmHWM` from `/proc/self/status`, in KiB (0 where it cannot be read).
pub(crate) fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
