//! Following an access log across rotations, with a read position that survives
//! restarts.
//!
//! [`LogFollower::poll`] reads every complete line appended since the last call. At
//! the end of the file it looks at the path again:
//!
//! - **rename rotation** (`mv access.log access.log.1`, then the server reopens): the
//!   path names another inode. The old file is read to its end for `rotate_grace`
//!   more (the server writes to it until it reopens), then the new file is read from
//!   its start;
//! - **copy-truncate** (`cp` then `truncate`): the same inode, now shorter than the
//!   read position. Reading restarts at 0. Lines written between the copy and the
//!   truncate are lost to every follower (that is copy-truncate's own race), and a
//!   file that grew past the old position before the next poll looks unrotated:
//!   prefer rename rotation.
//!
//! A [`Position`] is the inode and the offset just past the last complete line
//! handed out; a line is handed out once. A partial last line waits for its newline.
//! A line longer than `max_line` is skipped whole and counted.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Buffers read by one [`LogFollower::poll`] at most.
const READS_PER_POLL: usize = 16;

/// Where reading stopped: the file (by inode) and the offset after the last complete
/// line handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The file's inode.
    pub inode: u64,
    /// Bytes consumed.
    pub offset: u64,
}

impl Position {
    /// Reads a state file; `None` when it is absent or unreadable (start over at the
    /// current file's start, and say so in the log).
    pub fn load(path: &Path) -> Option<Position> {
        let text = std::fs::read_to_string(path).ok()?;
        match serde_json::from_str(&text) {
            Ok(position) => Some(position),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "state file unreadable; reading the log from its start");
                None
            }
        }
    }

    /// Writes a state file atomically (a temporary file renamed over it), so a crash
    /// mid-write leaves the previous position.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(self).map_err(io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }
}

/// Counts of what the follower saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FollowStats {
    /// Rename rotations followed.
    pub rotations: u64,
    /// Truncations followed.
    pub truncations: u64,
    /// Lines longer than `max_line`, skipped.
    pub overlong: u64,
}

struct Open {
    file: File,
    inode: u64,
    /// Offset of the next byte to read.
    read_to: u64,
    /// When the path was first seen naming another file.
    rotated_since: Option<Instant>,
}

/// Reads complete lines from a log file, across rotations.
pub struct LogFollower {
    path: PathBuf,
    open: Option<Open>,
    /// Where to resume when the file is first opened.
    resume: Option<Position>,
    /// Bytes read past the last newline.
    pending: Vec<u8>,
    /// Skipping the rest of an overlong line.
    skipping: bool,
    max_line: usize,
    rotate_grace: Duration,
    buf: Vec<u8>,
    stats: FollowStats,
}

impl std::fmt::Debug for LogFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFollower")
            .field("path", &self.path)
            .field("position", &self.position())
            .finish_non_exhaustive()
    }
}

impl LogFollower {
    /// A follower of `path` that resumes at `resume` if it still names the same file
    /// (and the file is at least that long), else reads from the start.
    pub fn new(
        path: PathBuf,
        resume: Option<Position>,
        max_line: usize,
        rotate_grace: Duration,
    ) -> LogFollower {
        LogFollower {
            path,
            open: None,
            resume,
            pending: Vec::new(),
            skipping: false,
            max_line,
            rotate_grace,
            buf: vec![0; 256 * 1024],
            stats: FollowStats::default(),
        }
    }

    /// The position after the last complete line handed out (inode 0 before the
    /// file was first opened: then the resume position, if any).
    pub fn position(&self) -> Position {
        match &self.open {
            Some(open) => Position {
                inode: open.inode,
                offset: open.read_to - self.pending.len() as u64,
            },
            None => self.resume.unwrap_or(Position {
                inode: 0,
                offset: 0,
            }),
        }
    }

    /// Bytes of the file being read past [`Self::position`]: how far the agent is
    /// behind the log (0 before the file is open, or when its size cannot be read).
    pub fn unread_bytes(&self) -> u64 {
        let Some(open) = &self.open else { return 0 };
        let len = open.file.metadata().map_or(0, |m| m.len());
        len.saturating_sub(self.position().offset)
    }

    /// Rotations, truncations and overlong lines so far.
    pub fn stats(&self) -> FollowStats {
        self.stats
    }

    fn open_path(&mut self) -> io::Result<bool> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let mut read_to = 0;
        if let Some(resume) = self.resume.take() {
            if resume.inode == meta.ino() && resume.offset <= meta.len() {
                read_to = resume.offset;
                file.seek(SeekFrom::Start(read_to))?;
            } else {
                tracing::info!(path = %self.path.display(), "the saved position names another file: reading from the start");
            }
        }
        self.open = Some(Open {
            file,
            inode: meta.ino(),
            read_to,
            rotated_since: None,
        });
        Ok(true)
    }

    /// Reads what is there and calls `line` with each complete line (without its
    /// newline). Returns how many lines it handed out.
    pub fn poll(&mut self, mut line: impl FnMut(&[u8])) -> io::Result<usize> {
        if self.open.is_none() && !self.open_path()? {
            return Ok(0);
        }
        let mut lines = 0;
        loop {
            let (read, at_end) = self.read_available(&mut line)?;
            lines += read;
            if !at_end {
                // A bounded amount per call, so a large backlog cannot hold off the
                // caller's shutdown check; the next call carries on.
                return Ok(lines);
            }
            match self.check_path()? {
                PathState::Same => return Ok(lines),
                PathState::Switch => {
                    // What the old file ended with, without a newline, is still a line.
                    if !self.pending.is_empty() && !self.skipping {
                        line(&self.pending);
                        lines += 1;
                    }
                    self.pending.clear();
                    self.skipping = false;
                    self.open = None;
                    self.stats.rotations += 1;
                    if !self.open_path()? {
                        return Ok(lines);
                    }
                }
                PathState::Truncated => {
                    self.pending.clear();
                    self.skipping = false;
                    self.stats.truncations += 1;
                    if let Some(open) = self.open.as_mut() {
                        open.file.seek(SeekFrom::Start(0))?;
                        open.read_to = 0;
                    }
                }
            }
        }
    }

    /// Reads towards the current end of the open file (at most `READS_PER_POLL`
    /// buffers), handing out complete lines; also whether it reached the end.
    fn read_available(&mut self, line: &mut impl FnMut(&[u8])) -> io::Result<(usize, bool)> {
        let mut lines = 0;
        let Some(open) = self.open.as_mut() else {
            return Ok((0, true));
        };
        for _ in 0..READS_PER_POLL {
            let n = open.file.read(&mut self.buf)?;
            if n == 0 {
                return Ok((lines, true));
            }
            open.read_to += n as u64;
            let mut chunk = &self.buf[..n];
            while let Some(i) = memchr::memchr(b'\n', chunk) {
                let (head, rest) = (&chunk[..i], &chunk[i + 1..]);
                if self.skipping {
                    self.skipping = false;
                } else if self.pending.len() + head.len() > self.max_line {
                    self.stats.overlong += 1;
                } else if self.pending.is_empty() {
                    line(head);
                    lines += 1;
                } else {
                    self.pending.extend_from_slice(head);
                    line(&self.pending);
                    lines += 1;
                }
                self.pending.clear();
                chunk = rest;
            }
            if !self.skipping {
                if self.pending.len() + chunk.len() > self.max_line {
                    self.stats.overlong += 1;
                    self.pending.clear();
                    self.skipping = true;
                } else {
                    self.pending.extend_from_slice(chunk);
                }
            }
        }
        Ok((lines, false))
    }

    fn check_path(&mut self) -> io::Result<PathState> {
        let Some(open) = self.open.as_mut() else {
            return Ok(PathState::Same);
        };
        let current = match std::fs::metadata(&self.path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match current {
            Some(meta) if meta.ino() == open.inode => {
                open.rotated_since = None;
                Ok(if meta.len() < open.read_to {
                    PathState::Truncated
                } else {
                    PathState::Same
                })
            }
            // Renamed (or removed): keep reading the old file until the server has
            // surely reopened, then switch.
            other => {
                let since = *open.rotated_since.get_or_insert_with(Instant::now);
                Ok(if other.is_some() && since.elapsed() >= self.rotate_grace {
                    PathState::Switch
                } else {
                    PathState::Same
                })
            }
        }
    }
}

enum PathState {
    Same,
    Switch,
    Truncated,
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn collect(follower: &mut LogFollower) -> Vec<String> {
        let mut out = Vec::new();
        follower
            .poll(|l| out.push(String::from_utf8_lossy(l).into_owned()))
            .unwrap();
        out
    }

    #[test]
    fn a_partial_line_waits_for_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, "one\ntw");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::ZERO);
        assert_eq!(collect(&mut f), ["one"]);
        assert_eq!(f.position().offset, 4);
        append(&path, "o\n");
        assert_eq!(collect(&mut f), ["two"]);
        assert_eq!(f.position().offset, 8);
    }

    /// The lag is what the file holds past the position: a partial line and lines
    /// written since the last poll; 0 once everything complete is read.
    #[test]
    fn the_unread_bytes_are_the_file_past_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, "one\ntw");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::ZERO);
        assert_eq!(f.unread_bytes(), 0, "not open yet");
        assert_eq!(collect(&mut f), ["one"]);
        assert_eq!(f.unread_bytes(), 2, "the partial line");
        append(&path, "o\nthree\n");
        assert_eq!(f.unread_bytes(), 10);
        assert_eq!(collect(&mut f), ["two", "three"]);
        assert_eq!(f.unread_bytes(), 0);
    }

    #[test]
    fn a_rename_rotation_reads_the_old_file_to_its_end_then_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, "a\n");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::ZERO);
        assert_eq!(collect(&mut f), ["a"]);
        // The server writes once more to the old file before it reopens.
        std::fs::rename(&path, dir.path().join("access.log.1")).unwrap();
        append(&dir.path().join("access.log.1"), "b\n");
        append(&path, "c\n");
        assert_eq!(collect(&mut f), ["b", "c"]);
        assert_eq!(f.stats().rotations, 1);
    }

    #[test]
    fn the_old_file_is_kept_for_the_rotation_grace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, "a\n");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::from_secs(3600));
        assert_eq!(collect(&mut f), ["a"]);
        std::fs::rename(&path, dir.path().join("access.log.1")).unwrap();
        append(&path, "new\n");
        assert_eq!(collect(&mut f), Vec::<String>::new());
        append(&dir.path().join("access.log.1"), "late\n");
        assert_eq!(collect(&mut f), ["late"]);
        assert_eq!(f.stats().rotations, 0);
    }

    #[test]
    fn a_copy_truncate_restarts_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, "first line\n");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::ZERO);
        assert_eq!(collect(&mut f), ["first line"]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        append(&path, "x\n");
        assert_eq!(collect(&mut f), ["x"]);
        assert_eq!(f.stats().truncations, 1);
    }

    #[test]
    fn a_saved_position_resumes_on_the_same_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let state = dir.path().join("state.json");
        append(&path, "a\nb\n");
        let mut f = LogFollower::new(path.clone(), None, 1024, Duration::ZERO);
        assert_eq!(collect(&mut f), ["a", "b"]);
        f.position().save(&state).unwrap();
        append(&path, "c\n");
        let mut resumed =
            LogFollower::new(path.clone(), Position::load(&state), 1024, Duration::ZERO);
        assert_eq!(collect(&mut resumed), ["c"]);
        // Another file at the path: the saved offset means nothing there.
        std::fs::rename(&path, dir.path().join("old")).unwrap();
        append(&path, "d\n");
        let mut other = LogFollower::new(path, Position::load(&state), 1024, Duration::ZERO);
        assert_eq!(collect(&mut other), ["d"]);
    }

    #[test]
    fn an_overlong_line_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        append(&path, &format!("ok\n{}\nnext\n", "x".repeat(100)));
        let mut f = LogFollower::new(path, None, 10, Duration::ZERO);
        assert_eq!(collect(&mut f), ["ok", "next"]);
        assert_eq!(f.stats().overlong, 1);
    }
}
