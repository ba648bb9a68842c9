//! Request ids for requests that come without one: 128 random bits in hex, from the thread's
//! generator (no system call, no lock per request).

use http::{HeaderValue, Request};
use tower_http::request_id::{MakeRequestId, RequestId};

/// Makes a random 32-hex-digit request id.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomId;

impl MakeRequestId for RandomId {
    fn make_request_id<B>(&mut self, _request: &Request<B>) -> Option<RequestId> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let bits: u128 = rand::random();
        let mut id = [0u8; 32];
        for (i, digit) in id.iter_mut().enumerate() {
            *digit = HEX[((bits >> (4 * i)) & 0xf) as usize];
        }
        HeaderValue::from_bytes(&id).ok().map(RequestId::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_hex_digits_and_differ() {
        let req = Request::new(());
        let mut make = RandomId;
        let a = make.make_request_id(&req).map(RequestId::into_header_value);
        let b = make.make_request_id(&req).map(RequestId::into_header_value);
        let a = a.as_ref().and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(Some(a), b.as_ref().and_then(|v| v.to_str().ok()));
    }
}
