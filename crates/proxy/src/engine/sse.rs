//! A server-sent-events decoder for engine streams: bytes in, the `data` of each event out.
//! Only `data:` fields matter to SGLang and vLLM streams; comments and other fields are
//! skipped. Lines end with `\n` or `\r\n`. One event is limited in size so a misbehaving
//! engine cannot grow the buffer without bound.

/// Incremental decoder; feed it body frames in order.
pub(crate) struct SseDecoder {
    /// Bytes not yet split into lines.
    pending: Vec<u8>,
    /// Where to continue looking for `\n` in `pending`.
    scanned: usize,
    /// The current event's data lines, joined with `\n`.
    data: Vec<u8>,
    has_data: bool,
    event_bytes_max: usize,
}

impl SseDecoder {
    pub fn new(event_bytes_max: usize) -> Self {
        Self {
            pending: Vec::new(),
            scanned: 0,
            data: Vec::new(),
            has_data: false,
            event_bytes_max,
        }
    }

    /// Appends `bytes` and moves each complete event's data to `events`. An error means the
    /// stream is unusable (an event over the size limit).
    pub fn push(&mut self, bytes: &[u8], events: &mut Vec<Vec<u8>>) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        let mut line_start = 0;
        let mut search = self.scanned;
        while let Some(offset) = self.pending[search..]
            .iter()
            .position(|&byte| byte == b'\n')
        {
            let newline = search + offset;
            let mut line_end = newline;
            if line_end > line_start && self.pending[line_end - 1] == b'\r' {
                line_end -= 1;
            }
            let line = &self.pending[line_start..line_end];
            if line.is_empty() {
                if self.has_data {
                    events.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                let value = value.strip_prefix(b" ").unwrap_or(value);
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            line_start = newline + 1;
            search = line_start;
        }
        self.pending.drain(..line_start);
        self.scanned = self.pending.len();
        if self.pending.len() + self.data.len() > self.event_bytes_max {
            return Err(format!("an event exceeds {} bytes", self.event_bytes_max));
        }
        Ok(())
    }

    /// Whether bytes of an unfinished event are buffered (at end of stream: it was cut).
    pub fn is_mid_event(&self) -> bool {
        self.has_data || !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(pieces: &[&[u8]]) -> Vec<String> {
        let mut decoder = SseDecoder::new(1 << 20);
        let mut events = Vec::new();
        for piece in pieces {
            decoder.push(piece, &mut events).expect("within limits");
        }
        events
            .into_iter()
            .map(|event| String::from_utf8(event).expect("utf-8"))
            .collect()
    }

    #[test]
    fn events_survive_any_split() {
        let stream =
            b"data: {\"a\":1}\n\n: comment\r\ndata:[DONE]\r\n\r\nevent: x\ndata: a\ndata: b\n\n";
        let expected = vec!["{\"a\":1}", "[DONE]", "a\nb"];
        assert_eq!(decode(&[stream]), expected);
        for split in 0..stream.len() {
            let (left, right) = stream.split_at(split);
            assert_eq!(decode(&[left, right]), expected, "split at {split}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decode(&bytes), expected);
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut decoder = SseDecoder::new(8);
        let mut events = Vec::new();
        assert!(decoder.push(b"data: 0123456789", &mut events).is_err());
        let mut decoder = SseDecoder::new(8);
        assert!(decoder.push(b"data: 01\n\n", &mut events).is_ok());
        assert!(!decoder.is_mid_event());
        assert!(decoder.push(b"data: 0", &mut events).is_ok());
        assert!(decoder.is_mid_event());
    }
}
