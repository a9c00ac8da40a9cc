//! `octoflow run`'s output for models that answer in channels (gpt-oss's harmony format): the
//! final channel goes to stdout, the analysis channel (chain of thought) to stderr when asked
//! (`--reasoning`), marked so it cannot be taken for the answer; function calls are shown on
//! stderr. Models without channels write straight through.

use std::io::Write;

use octoflow_text::harmony::{Delta, HarmonyParser, Part};

/// A writer that splits a generated stream by channel.
pub struct ChannelWriter<W: Write, E: Write> {
    parser: Option<HarmonyParser>,
    out: W,
    err: E,
    show_reasoning: bool,
    /// UTF-8 bytes of a character not yet whole.
    pending: Vec<u8>,
    /// The message (index) whose text was last written to stderr, to close its line.
    open: Option<usize>,
}

impl<W: Write, E: Write> ChannelWriter<W, E> {
    /// `harmony`: whether the model answers in channels; `show_reasoning`: whether the
    /// analysis channel is written (to `err`).
    pub fn new(out: W, err: E, harmony: bool, show_reasoning: bool) -> Self {
        Self {
            parser: harmony.then(HarmonyParser::new),
            out,
            err,
            show_reasoning,
            pending: Vec::new(),
            open: None,
        }
    }

    /// Ends the reply: writes what the parser held and closes an open reasoning line. The
    /// writer is ready for the next reply (chat mode).
    pub fn finish(&mut self) -> std::io::Result<()> {
        let rest = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
        let mut deltas = match &mut self.parser {
            Some(p) => p.push(&rest),
            None => return self.out.write_all(rest.as_bytes()),
        };
        if let Some(p) = &mut self.parser {
            deltas.extend(p.finish());
            *p = HarmonyParser::new();
        }
        self.write_deltas(&deltas)?;
        self.close()?;
        self.out.flush()
    }

    fn close(&mut self) -> std::io::Result<()> {
        if self.open.take().is_some() {
            self.err.write_all(b"\n")?;
        }
        self.err.flush()
    }

    fn write_deltas(&mut self, deltas: &[Delta]) -> std::io::Result<()> {
        for d in deltas {
            match d.header.part() {
                Part::Content => {
                    self.close()?;
                    self.out.write_all(d.text.as_bytes())?;
                }
                Part::Reasoning if !self.show_reasoning => {}
                Part::Reasoning | Part::ToolCall(_) => {
                    if self.open != Some(d.index) {
                        self.close()?;
                        match d.header.part() {
                            Part::ToolCall(name) => write!(self.err, "[tool call {name}] ")?,
                            _ => write!(self.err, "[reasoning] ")?,
                        }
                        self.open = Some(d.index);
                    }
                    self.err.write_all(d.text.as_bytes())?;
                }
            }
        }
        Ok(())
    }
}

impl<W: Write, E: Write> Write for ChannelWriter<W, E> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(parser) = &mut self.parser else {
            return self.out.write(buf);
        };
        self.pending.extend_from_slice(buf);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        let deltas = parser.push(&text);
        self.write_deltas(&deltas)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.err.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(stream: &[&str], show: bool) -> (String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut w = ChannelWriter::new(&mut out, &mut err, true, show);
        for s in stream {
            w.write_all(s.as_bytes()).expect("write");
        }
        w.finish().expect("finish");
        drop(w);
        (
            String::from_utf8(out).expect("utf-8"),
            String::from_utf8(err).expect("utf-8"),
        )
    }

    #[test]
    fn final_channel_to_stdout_reasoning_to_stderr_when_asked() {
        let stream = [
            "<|channel|>analysis<|mess",
            "age|>Think ü",
            "<|end|><|start|>assistant<|channel|>final<|message|>Answer",
        ];
        assert_eq!(
            split(&stream, true),
            ("Answer".into(), "[reasoning] Think ü\n".into())
        );
        assert_eq!(split(&stream, false), ("Answer".into(), String::new()));
    }

    #[test]
    fn a_character_split_across_writes_stays_whole() {
        let bytes = "<|channel|>final<|message|>ü".as_bytes();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut w = ChannelWriter::new(&mut out, &mut err, true, false);
        for b in bytes {
            w.write_all(&[*b]).expect("write");
        }
        w.finish().expect("finish");
        drop(w);
        assert_eq!(String::from_utf8(out).expect("utf-8"), "ü");
    }

    #[test]
    fn models_without_channels_write_through() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut w = ChannelWriter::new(&mut out, &mut err, false, true);
        w.write_all("<|channel|>x".as_bytes()).expect("write");
        w.finish().expect("finish");
        drop(w);
        assert_eq!(out, b"<|channel|>x");
        assert!(err.is_empty());
    }
}
