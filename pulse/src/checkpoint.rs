//! Checkpoints: every owned partition's heat map, with the offset it holds every
//! event below, written to a file periodically and at shutdown. At start the file is
//! read, and each snapshot waits for its partition to be assigned: the partition then
//! starts from the snapshot and replays from its offset up to the committed one.
//!
//! Each partition's predictor's online calibration goes with its heat map, for the
//! model it was counted for, and so does what the predictor learnt of its traffic
//! whatever the model (its tenants' paces, its records of first- and second-region
//! commands); each absent in a file of an earlier build reads as none.
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
use crate::partition::Partitions;
use crate::predict::{SavedCalibration, SavedTraffic};

/// The checkpoint format this build writes and reads. Version 5: one heat map per
/// owned partition with its next offset (version 4: one heat map per process, no
/// offsets). An older checkpoint is refused with a [`CheckpointError::Format`] naming
/// both versions, and `start` then begins empty with a warning.
pub(crate) const CHECKPOINT_VERSION: u32 = 5;

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
    topic: &'a str,
    partition_count: i32,
    partitions: Vec<PartitionRef<'a>>,
}

#[derive(Serialize)]
struct PartitionRef<'a> {
    partition: i32,
    next_offset: i64,
    heat: &'a HeatMap,
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration: Option<SavedCalibration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic: Option<SavedTraffic>,
}

#[derive(Deserialize)]
struct CheckpointOwned {
    version: u32,
    topic: String,
    partition_count: i32,
    partitions: Vec<PartitionSnapshot>,
}

/// A checkpoint as read back.
pub struct Checkpoint {
    /// The events topic it was taken from.
    pub topic: String,
    /// That topic's partition count then.
    pub partition_count: i32,
    /// The partitions owned then.
    pub partitions: Vec<PartitionSnapshot>,
}

/// One partition in a checkpoint.
#[derive(Deserialize)]
pub struct PartitionSnapshot {
    /// The partition.
    pub partition: i32,
    /// The heat map holds every event below this offset.
    pub next_offset: i64,
    /// Its heat map.
    pub heat: HeatMap,
    /// Its predictor's online calibration.
    #[serde(default)]
    pub(crate) calibration: Option<SavedCalibration>,
    /// What its predictor learnt of its traffic.
    #[serde(default)]
    pub(crate) traffic: Option<SavedTraffic>,
}

/// Read first, so an older version is named as such rather than as a shape error.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes every partition `partitions` owns of `topic`, and the snapshots still
/// waiting for their partition, to `path` atomically (temporary file, fsync, rename).
pub(crate) fn save(
    path: &Path,
    topic: &str,
    partitions: &Partitions,
) -> Result<(), CheckpointError> {
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
            topic,
            partition_count: partitions.partition_count(),
            partitions: partitions
                .states()
                .values()
                .map(|s| PartitionRef {
                    partition: s.partition,
                    next_offset: s.next_offset,
                    heat: &s.heat,
                    calibration: s.saved_calibration(),
                    traffic: s.saved_traffic(),
                })
                // Parked snapshots (a lost assignment, or not assigned yet) are kept
                // until their partition comes back.
                .chain(
                    partitions
                        .parked()
                        .filter(|(p, _)| partitions.get(*p).is_none())
                        .map(|(partition, s)| PartitionRef {
                            partition,
                            next_offset: s.next_offset,
                            heat: &s.heat,
                            calibration: s.calibration.clone(),
                            traffic: s.traffic.clone(),
                        }),
                )
                .collect(),
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
pub fn load(path: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let format = |reason: String| CheckpointError::Format {
        path: path.display().to_string(),
        reason,
    };
    match serde_json::from_reader::<_, CheckpointOwned>(BufReader::new(file)) {
        Ok(owned) if owned.version == CHECKPOINT_VERSION => Ok(Some(Checkpoint {
            topic: owned.topic,
            partition_count: owned.partition_count,
            partitions: owned.partitions,
        })),
        Ok(owned) => Err(format(format!(
            "version {} (this build reads {CHECKPOINT_VERSION})",
            owned.version
        ))),
        Err(e) => {
            // An older version has another shape: read the file again for its version
            // alone (the rest skipped), so the refusal names it.
            let version = fs::File::open(path).ok().and_then(|f| {
                serde_json::from_reader::<_, VersionOnly>(BufReader::new(f))
                    .ok()
                    .map(|v| v.version)
            });
            Err(format(match version {
                Some(v) if v != CHECKPOINT_VERSION => {
                    format!("version {v} (this build reads {CHECKPOINT_VERSION})")
                }
                _ => e.to_string(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};

    use std::sync::Arc;

    use super::*;
    use crate::heat::{HeatConfig, Window};
    use crate::partition::PartitionTemplate;
    use crate::predict::{PredictorConfig, ScoringModel, default_model};

    /// Each owned partition's heat map comes back with its offset.
    #[test]
    fn round_trip_keeps_each_partition_and_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.ckpt");
        assert!(load(&path).unwrap().is_none());

        let mut partitions = Partitions::heat_only(4);
        partitions.assign(1, None, 0, 0);
        partitions.assign(3, None, 0, 0);
        let tenant = TenantId::new("acme").unwrap();
        for (p, state) in partitions.states_mut() {
            for i in 0..300u64 {
                let e = AccessEvent::new(
                    1_764_470_000_000 + i * 7,
                    tenant.clone(),
                    CacheKey::new(format!("/k/{p}/{}", i % 5)).unwrap(),
                    RegionId::new(["eu", "us"][i as usize % 2]).unwrap(),
                    NodeId::new("n1").unwrap(),
                    Outcome::ALL[i as usize % 6],
                );
                state.heat.apply(&e).unwrap();
            }
            state.next_offset = 300 + i64::from(*p);
        }
        save(&path, "events", &partitions).unwrap();
        // Saving again replaces the file and leaves no temporary behind.
        save(&path, "events", &partitions).unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);

        let back = load(&path).unwrap().expect("a checkpoint");
        assert_eq!((back.topic.as_str(), back.partition_count), ("events", 4));
        assert_eq!(back.partitions.len(), 2);
        for snapshot in &back.partitions {
            let heat = &partitions.get(snapshot.partition).unwrap().heat;
            assert_eq!(snapshot.next_offset, 300 + i64::from(snapshot.partition));
            let now = heat.now_ms();
            assert_eq!(snapshot.heat.now_ms(), now);
            assert_eq!(snapshot.heat.tenants(), heat.tenants());
            assert_eq!(
                snapshot
                    .heat
                    .hot_keys(&tenant, None, Window::S60, 10, now)
                    .unwrap(),
                heat.hot_keys(&tenant, None, Window::S60, 10, now).unwrap()
            );
        }
    }

    /// Two partitions of a topic, each with a predictor scoring with `model`.
    fn predicting(model: &Arc<ScoringModel>) -> Partitions {
        let template = PartitionTemplate {
            heat: HeatConfig::default(),
            allowed_tenants: None,
            predictor: Some(PredictorConfig::default()),
        };
        let mut partitions = Partitions::new(template, Some(model.clone()));
        partitions.set_partition_count(2);
        partitions
    }

    /// A partition's online calibration goes into the checkpoint and comes back onto
    /// the predictor of the partition's next state, counted for the same model.
    #[test]
    fn the_online_calibration_comes_back_with_its_partition() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.ckpt");
        let model = Arc::new(default_model());
        let with_prediction = || predicting(&model);
        let (mut viral, mut moments) = (vec![0.0; 14], vec![0.0; 14]);
        (viral[11], moments[11]) = (3.0, 30.0);
        let zeros = serde_json::json!({"viral": vec![0.0; 14], "moments": vec![0.0; 14]});
        let counted = serde_json::json!({
            "model": [model.name, model.trained_at_ms],
            "counts": {"fleet": [{"viral": viral, "moments": moments}, zeros], "tenants": {}},
        });
        let mut partitions = with_prediction();
        let state = partitions.assign(1, None, 0, 0);
        assert!(state.restore_calibration(serde_json::from_value(counted.clone()).unwrap()));

        save(&path, "events", &partitions).unwrap();
        let mut back = load(&path).unwrap().expect("a checkpoint");
        let snapshot = back.partitions.remove(0);
        let saved = snapshot
            .calibration
            .expect("the calibration is in the checkpoint");
        assert_eq!(serde_json::to_value(&saved).unwrap(), counted);

        let mut restarted = with_prediction();
        let state = restarted.assign(1, Some(snapshot.heat), 0, 0);
        assert!(state.restore_calibration(saved));
        let now = serde_json::to_value(state.saved_calibration().unwrap()).unwrap();
        assert_eq!(now, counted);
    }

    /// What a partition's predictor learnt of its traffic (its tenants' paces, the
    /// trust of each step's commands) goes into the checkpoint and comes back onto the
    /// partition's next state, whatever its model (a file of an earlier build, with
    /// records of first- and second-region commands instead, gives the trust's prior);
    /// paces that are no paces (a negative gap) are refused, and so is a trust whose
    /// tallies are no counts.
    #[test]
    fn the_paces_and_the_trust_come_back_with_their_partition() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pulse.ckpt");
        let model = Arc::new(default_model());
        let with_prediction = || predicting(&model);
        let tally = |useful: f64, promised: f64| serde_json::json!({"useful": useful, "promised": promised, "at_ms": 3000});
        let none = tally(0.0, 0.0);
        let steps = serde_json::json!([none, tally(1.0, 2.9), none, none]);
        let learnt = serde_json::json!({
            "paces": {"tenants": {"acme": 21000.0}, "fleet": 15000.0},
            "trust": {"fleet": steps, "tenants": {"acme": steps}},
        });
        let mut partitions = with_prediction();
        let state = partitions.assign(1, None, 0, 0);
        assert!(state.restore_traffic(serde_json::from_value(learnt.clone()).unwrap()));

        save(&path, "events", &partitions).unwrap();
        let mut back = load(&path).unwrap().expect("a checkpoint");
        let snapshot = back.partitions.remove(0);
        let saved = snapshot.traffic.expect("the paces are in the checkpoint");
        assert_eq!(serde_json::to_value(&saved).unwrap(), learnt);

        let mut restarted = with_prediction();
        let state = restarted.assign(1, Some(snapshot.heat), 0, 0);
        assert!(state.restore_traffic(saved));
        let now = serde_json::to_value(state.saved_traffic().unwrap()).unwrap();
        assert_eq!(now, learnt);

        // A checkpoint an older build wrote has records instead of the trust: the prior.
        let older = serde_json::json!({
            "paces": learnt["paces"],
            "first_regions": {"outcomes": [[1000, true], [2000, false]]},
            "second_regions": {"outcomes": [[4000, false]]},
        });
        let mut upgraded = with_prediction();
        let state = upgraded.assign(1, None, 0, 0);
        assert!(state.restore_traffic(serde_json::from_value(older).unwrap()));
        let now = serde_json::to_value(state.saved_traffic().unwrap()).unwrap();
        assert_eq!(now["trust"]["tenants"], serde_json::json!({}));
        assert_eq!(now["paces"], learnt["paces"]);

        let mut no_counts = learnt.clone();
        no_counts["trust"]["fleet"][1]["useful"] = serde_json::json!(-1.0);
        let mut fresh = with_prediction();
        let state = fresh.assign(1, None, 0, 0);
        assert!(state.restore_traffic(serde_json::from_value(no_counts).unwrap()));
        let kept = serde_json::to_value(state.saved_traffic().unwrap()).unwrap();
        assert_eq!(kept["trust"]["tenants"], serde_json::json!({}));

        let mut bad = learnt.clone();
        bad["paces"]["fleet"] = serde_json::json!(-1.0);
        let mut fresh = with_prediction();
        let state = fresh.assign(1, None, 0, 0);
        assert!(!state.restore_traffic(serde_json::from_value(bad).unwrap()));
        let kept = serde_json::to_value(state.saved_traffic().unwrap()).unwrap();
        assert_eq!(
            kept["paces"],
            serde_json::json!({"tenants": {}, "fleet": null})
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

    /// A checkpoint of an older format (version 3: every tenant its own rings, no
    /// shared sketch; version 4: one heat map per process) is refused naming both
    /// versions, never misread.
    #[test]
    fn an_older_version_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.ckpt");
        fs::write(
            &path,
            br#"{"version":3,"heat":{"config":{"error":0.005,"confidence":0.99,"top_k":64,"region_top_k":16,"max_tenants":64},"watermark_ms":5,"tenants":{}}}"#,
        )
        .unwrap();
        let error = match load(&path) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a version 3 checkpoint was read"),
        };
        assert!(error.contains("version 3 (this build reads 5)"), "{error}");
        fs::write(
            &path,
            br#"{"version":4,"heat":{"config":{},"watermark_ms":5,"tenants":{}}}"#,
        )
        .unwrap();
        let error = match load(&path) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a version 4 checkpoint was read"),
        };
        assert!(error.contains("version 4 (this build reads 5)"), "{error}");
    }
}
