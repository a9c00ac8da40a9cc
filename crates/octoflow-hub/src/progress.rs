//! Progress reporting on stderr, and the copy loop that drives it.
//!
//! On a terminal: an indicatif bar. Otherwise (logs, CI): one line when a transfer starts and one
//! when it ends, so logs stay readable. Disabled entirely when the caller asks for quiet.

use std::io::{self, IsTerminal, Read, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// Reports one transfer of bytes.
pub(crate) struct Progress {
    mode: Mode,
    label: String,
    start: Instant,
    done: u64,
    first: u64,
}

enum Mode {
    Quiet,
    Lines,
    Bar(ProgressBar),
}

impl Progress {
    /// Starts reporting `label`, of `total` bytes if known, `already` of which exist (resume).
    pub(crate) fn start(enabled: bool, label: &str, total: Option<u64>, already: u64) -> Self {
        let mode = if !enabled {
            Mode::Quiet
        } else if io::stderr().is_terminal() {
            Mode::Bar(make_bar(label, total, already))
        } else {
            let size = total
                .map(|t| format!(" ({})", human_bytes(t)))
                .unwrap_or_default();
            let resume = if already > 0 {
                format!(", resuming at {}", human_bytes(already))
            } else {
                String::new()
            };
            eprintln!("{label}{size}{resume} ...");
            Mode::Lines
        };
        Self {
            mode,
            label: label.to_string(),
            start: Instant::now(),
            done: already,
            first: already,
        }
    }

    pub(crate) fn inc(&mut self, n: u64) {
        self.done += n;
        if let Mode::Bar(bar) = &self.mode {
            bar.inc(n);
        }
    }

    /// Ends the report with a summary (bytes, seconds, rate).
    pub(crate) fn finish(mut self) {
        let secs = self.start.elapsed().as_secs_f64();
        let moved = self.done - self.first;
        let rate = if secs > 0.0 { moved as f64 / secs } else { 0.0 };
        let summary = format!(
            "{}: {} in {secs:.1} s ({}/s)",
            self.label,
            human_bytes(self.done),
            human_bytes(rate as u64)
        );
        match std::mem::replace(&mut self.mode, Mode::Quiet) {
            Mode::Quiet => {}
            Mode::Lines => eprintln!("{summary}"),
            Mode::Bar(bar) => {
                bar.finish_and_clear();
                eprintln!("{summary}");
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.abandon();
        }
    }
}

fn make_bar(label: &str, total: Option<u64>, already: u64) -> ProgressBar {
    let (bar, template) = match total {
        Some(t) => (
            ProgressBar::new(t),
            "{msg} [{wide_bar}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
        ),
        None => (ProgressBar::new_spinner(), "{msg} {spinner} {decimal_bytes} {decimal_bytes_per_sec}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar.set_position(already);
    bar
}

/// `1234567` -> `"1.2 MB"` (decimal units, like PyPI and pip show sizes).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Where a copy failed: reading the source (after `copied` bytes) or writing the destination.
pub(crate) enum PumpError {
    Read { error: io::Error, copied: u64 },
    Write(io::Error),
}

/// Copies `reader` to `writer` in 256 KiB steps, reporting each step; returns the bytes copied.
pub(crate) fn pump(
    reader: &mut dyn Read,
    writer: &mut dyn Write,
    progress: &mut Progress,
) -> Result<u64, PumpError> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut copied = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(copied),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(PumpError::Read { error, copied }),
        };
        writer.write_all(&buf[..n]).map_err(PumpError::Write)?;
        copied += n as u64;
        progress.inc(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_pip_shows_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(92_871_040), "92.9 MB");
        assert_eq!(human_bytes(491_400_064), "491.4 MB");
    }

    #[test]
    fn pump_copies_everything_and_reports_read_failures_with_the_count() {
        let mut progress = Progress::start(false, "t", None, 0);
        let mut out = Vec::new();
        let n = pump(&mut &b"hello"[..], &mut out, &mut progress)
            .ok()
            .unwrap();
        assert_eq!((n, out.as_slice()), (5, &b"hello"[..]));

        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
                }
                self.0 -= 1;
                buf[0] = 7;
                Ok(1)
            }
        }
        match pump(&mut Failing(3), &mut Vec::new(), &mut progress) {
            Err(PumpError::Read { copied, .. }) => assert_eq!(copied, 3),
            _ => panic!("expected a read error after 3 bytes"),
        }
    }
}
