//! Checkpoints: the heat map written to a file periodically and at shutdown, and
//! read back at start, so a restart keeps the heat map.
//!
//! A checkpoint is written atomically: to a temporary file in the same directory,
//! flushed to disk, then renamed over the old one, so a crash leaves either the old
//! or the new checkpoint, never half of one. Kafka offsets are committed only after
//! the rename (see the README, "Checkpoints and at-least-once").

use std::fs;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::heat::HeatMap;

/// The checkpoint format this build writes and reads. Version 3: the sketches place
/// keys by their own row hashes (no longer streaming_algorithms'), so an older
/// checkpoint would answer wrongly and is refused.
pub const CHECKPOINT_VERSION: u32 = 3;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a checkpoint this build understands.
    #[error("checkpoint {path} is unreadable: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Serialize)]
struct CheckpointRef<'a> {
    version: u32,
    heat: &'a HeatMap,
}

#[derive(Deserialize)]
struct CheckpointOwned {
    version: u32,
    heat: HeatMap,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `heat` to `path` atomically (temporary file, fsync, rename).
pub fn save(path: &Path, heat: &HeatMap) -> Result<(), CheckpointError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    let file = fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut writer = BufWriter::new(file);
    serde_json::to_writer(
        &mut writer,
        &CheckpointRef {
            version: CHECKPOINT_VERSION,
            heat,
        },
    )
    .map_err(|e| CheckpointError::Format {
        path: tmp.display().to_string(),
        reason: e.to_string(),
    })?;
    writer.flush().map_err(io(&tmp))?;
    let file = writer.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
    file.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))?;
    // Make the rename itself durable.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none yet.
pub fn load(path: &Path) -> Result<Option<HeatMap>, CheckpointError> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let format = |reason: String| CheckpointError::Format {
        path: path.display().to_string(),
        reason,
    };
    let owned: CheckpointOwned =
        serde_json::from_reader(BufReader::new(file)).map_err(|e| format(e.to_string()))?;
    if owned.version != CHECKPOINT_VERSION {
        return Err(format(format!(
            "version {} (this build reads {CHECKPOINT_VERSION})",
            owned.version
        )));
    }
    Ok(Some(owned.heat))
}

#[cfg(test)]
mod tests {
    use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};

    use super::*;
    use crate::heat::{HeatConfig, Window};

    #[test]
    fn round_trip_keeps_the_heat_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.ckpt");
        assert!(load(&path).unwrap().is_none());

        let mut heat = HeatMap::new(HeatConfig::default());
        let tenant = TenantId::new("acme").unwrap();
        for i in 0..300u64 {
            let e = AccessEvent::new(
                1_764_470_000_000 + i * 7,
                tenant.clone(),
                CacheKey::new(format!("/k/{}", i % 5)).unwrap(),
                RegionId::new(["eu", "us"][i as usize % 2]).unwrap(),
                NodeId::new("n1").unwrap(),
                Outcome::ALL[i as usize % 6],
            );
            heat.apply(&e).unwrap();
        }
        save(&path, &heat).unwrap();
        // Saving again replaces the file and leaves no temporary behind.
        save(&path, &heat).unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);

        let back = load(&path).unwrap().expect("a checkpoint");
        let now = heat.now_ms();
        assert_eq!(back.now_ms(), now);
        assert_eq!(back.config(), heat.config());
        assert_eq!(back.tenants(), heat.tenants());
        assert_eq!(
            back.hot_keys(&tenant, None, Window::S60, 10, now).unwrap(),
            heat.hot_keys(&tenant, None, Window::S60, 10, now).unwrap()
        );
        let key = CacheKey::new("/k/1").unwrap();
        assert_eq!(
            back.key_stats(&tenant, &key, now).unwrap(),
            heat.key_stats(&tenant, &key, now).unwrap()
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.ckpt");
        fs::write(&path, b"{\"version\":1,\"heat\":12}").unwrap();
        assert!(matches!(load(&path), Err(CheckpointError::Format { .. })));
        fs::write(&path, b"{\"version\":99,\"heat\":null}").unwrap();
        assert!(load(&path).is_err());
    }
}
