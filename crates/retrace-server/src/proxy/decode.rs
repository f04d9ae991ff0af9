//! Compressed request bodies (`Content-Encoding: gzip, deflate, br, zstd`) are decoded before
//! anything else, so nothing compressed is ever keyed or stored.
use std::io::Read;

/// Why a body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// An encoding the proxy does not know.
    #[error("unsupported Content-Encoding {0:?} (the proxy decodes gzip, deflate, br and zstd)")]
    Unsupported(String),
    /// The bytes are not what the header says.
    #[error("the request body is not valid {encoding}: {message}")]
    Corrupt {
        /// The encoding.
        encoding: String,
        /// The decoder's message.
        message: String,
    },
    /// The decoded body is over the limit.
    #[error("the decoded request body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
}

/// Decodes `body` as `content_encoding` says (a comma-separated list, applied in order).
pub fn decode_body(
    body: Vec<u8>,
    content_encoding: Option<&str>,
    limit: usize,
) -> Result<Vec<u8>, DecodeError> {
    let Some(header) = content_encoding else { return Ok(body) };
    let mut body = body;
    // Encodings are listed in the order they were applied: undo them from the last.
    for encoding in header.split(',').map(|e| e.trim().to_ascii_lowercase()).rev() {
        body = match encoding.as_str() {
            "" | "identity" => body,
            "gzip" | "x-gzip" => read_all(flate2::read::MultiGzDecoder::new(&body[..]), &encoding, limit)?,
            "deflate" => {
                // Servers disagree on whether deflate means zlib or raw deflate: try zlib first.
                match read_all(flate2::read::ZlibDecoder::new(&body[..]), &encoding, limit) {
                    Ok(out) => out,
                    Err(DecodeError::TooLarge { limit }) => return Err(DecodeError::TooLarge { limit }),
                    Err(_) => read_all(flate2::read::DeflateDecoder::new(&body[..]), &encoding, limit)?,
                }
            }
            "br" => read_all(brotli_decompressor::Decompressor::new(&body[..], 4096), &encoding, limit)?,
            "zstd" => {
                let decoder = zstd::stream::read::Decoder::new(&body[..]).map_err(|e| {
                    DecodeError::Corrupt { encoding: encoding.clone(), message: e.to_string() }
                })?;
                read_all(decoder, &encoding, limit)?
            }
            other => return Err(DecodeError::Unsupported(other.to_owned())),
        };
    }
    Ok(body)
}

fn read_all(reader: impl Read, encoding: &str, limit: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let read = reader.take(limit as u64 + 1).read_to_end(&mut out);
    read.map_err(|e| DecodeError::Corrupt { encoding: encoding.to_owned(), message: e.to_string() })?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn gzip_and_deflate_round_trip() {
        let body = br#"{"model":"m","messages":[]}"#.to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&body).unwrap();
        assert_eq!(decode_body(gz.finish().unwrap(), Some("gzip"), 1 << 20).unwrap(), body);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&body).unwrap();
        assert_eq!(decode_body(z.finish().unwrap(), Some("deflate"), 1 << 20).unwrap(), body);
        let zs = zstd::encode_all(&body[..], 0).unwrap();
        assert_eq!(decode_body(zs, Some("zstd"), 1 << 20).unwrap(), body);
        assert_eq!(decode_body(body.clone(), None, 1 << 20).unwrap(), body);
    }

    #[test]
    fn bombs_and_garbage_are_refused() {
        let big = vec![b' '; 10_000];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&big).unwrap();
        let packed = gz.finish().unwrap();
        assert!(matches!(decode_body(packed, Some("gzip"), 1000), Err(DecodeError::TooLarge { .. })));
        assert!(matches!(
            decode_body(b"nope".to_vec(), Some("gzip"), 1000),
            Err(DecodeError::Corrupt { .. })
        ));
        assert!(matches!(decode_body(b"x".to_vec(), Some("lzma"), 1000), Err(DecodeError::Unsupported(_))));
    }
}
