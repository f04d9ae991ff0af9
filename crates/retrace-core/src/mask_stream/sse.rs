//! Server-sent events located in a reassembled stream: each event's `data:` values and its
//! other lines, as byte ranges of the stream, so masking can splice into them in place.
//!
//! Lines end with `\n` (a `\r` before it is not part of the line). A line that begins with
//! `data` followed by `:` or nothing is a data line; its value starts after the colon and one
//! optional space. A blank line ends an event; an unterminated last event still counts, since
//! its bytes are persisted too.
use std::borrow::Cow;
use std::ops::Range;

/// One event's lines.
#[derive(Debug, Default)]
pub(super) struct Event {
    /// The values of its `data:` lines, in order.
    pub data: Vec<Range<usize>>,
    /// Its other lines (`event:`, `id:`, comments, anything else), whole.
    pub other: Vec<Range<usize>>,
}

impl Event {
    /// The event's data: its data lines joined by `\n` (borrowed when there is one line).
    pub fn data<'s>(&self, stream: &'s [u8]) -> Data<'s> {
        if let [only] = self.data.as_slice() {
            return Data { bytes: Cow::Borrowed(&stream[only.clone()]), pieces: vec![(0, only.start)] };
        }
        let mut bytes = Vec::new();
        let mut pieces = Vec::with_capacity(self.data.len());
        for (i, line) in self.data.iter().enumerate() {
            if i > 0 {
                bytes.push(b'\n');
            }
            pieces.push((bytes.len(), line.start));
            bytes.extend_from_slice(&stream[line.clone()]);
        }
        Data { bytes: Cow::Owned(bytes), pieces }
    }
}

/// An event's data with the way back to stream offsets.
#[derive(Debug)]
pub(super) struct Data<'s> {
    /// The joined data.
    pub bytes: Cow<'s, [u8]>,
    /// `(offset in bytes, offset in the stream)` where each data line starts.
    pieces: Vec<(usize, usize)>,
}

impl Data<'_> {
    /// The stream range of `range` in the data; `range` lies within one line (a JSON string
    /// never holds a raw newline).
    pub fn to_stream(&self, range: &Range<usize>) -> Range<usize> {
        let at = self.pieces.partition_point(|(start, _)| *start <= range.start).saturating_sub(1);
        let (data_start, stream_start) = self.pieces.get(at).copied().unwrap_or((0, 0));
        let start = stream_start + (range.start - data_start);
        start..start + range.len()
    }
}

/// The events of `stream`, in order.
pub(super) fn events(stream: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut current = Event::default();
    let mut start = 0;
    while start < stream.len() {
        let end = stream[start..].iter().position(|&b| b == b'\n').map_or(stream.len(), |n| start + n);
        let line_end = if end > start && stream[end - 1] == b'\r' { end - 1 } else { end };
        let line = &stream[start..line_end];
        if line.is_empty() {
            if !current.data.is_empty() || !current.other.is_empty() {
                events.push(std::mem::take(&mut current));
            }
        } else if let Some(value) = data_value(line) {
            current.data.push(start + value.start..start + value.end);
        } else {
            current.other.push(start..line_end);
        }
        start = end + 1;
    }
    if !current.data.is_empty() || !current.other.is_empty() {
        events.push(current);
    }
    events
}

/// Where a data line's value lies within the line, if it is one.
fn data_value(line: &[u8]) -> Option<Range<usize>> {
    let rest = line.strip_prefix(b"data")?;
    match rest.first() {
        None => Some(line.len()..line.len()),
        Some(b':') => {
            let skip = if rest.get(1) == Some(&b' ') { 6 } else { 5 };
            Some(skip..line.len())
        }
        Some(_) => None,
    }
}

pub(super) use crate::mask::string_spans;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_their_data_spans() {
        let s = b"event: a\r\ndata: {\"x\":1}\r\n\r\n: hi\ndata:two\ndata\ndata: three";
        let ev = events(s);
        assert_eq!(ev.len(), 2);
        assert_eq!(&s[ev[0].data[0].clone()], b"{\"x\":1}");
        assert_eq!(&s[ev[0].other[0].clone()], b"event: a");
        let d = ev[1].data(s);
        assert_eq!(&*d.bytes, b"two\n\nthree");
        let three = 5..10;
        assert_eq!(&s[d.to_stream(&three)], b"three");
        assert_eq!(&s[d.to_stream(&(0..3))], b"two");
    }

    #[test]
    fn string_spans_skip_escaped_quotes() {
        let raw = br#"{"a\"b": "c", "d"#;
        let spans = string_spans(raw);
        assert_eq!(spans.len(), 2);
        assert_eq!(&raw[spans[0].clone()], br#""a\"b""#);
    }
}
