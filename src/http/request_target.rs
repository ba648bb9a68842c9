//! The request target a listener accepts: origin-form (`/path?query`) only. `OPTIONS *` is
//! answered by the sidecar itself; any other asterisk-form or odd target is refused, so an
//! upstream URI is never built from something that is not a path (an `*` once turned into a
//! request to port 80 of the upstream host).

use http::uri::PathAndQuery;
use http::{header, Method, Request, Response, StatusCode};

use super::{body, ReachBody};
use crate::error::ReachError;

/// What to do with a request's target.
#[derive(Debug)]
pub(crate) enum Target {
    /// An origin-form path: forward it.
    Path(PathAndQuery),
    /// `OPTIONS *`: the sidecar answers it.
    ServerOptions,
}

/// Checks a request's target. Absolute-form (`GET http://host/path`) keeps only its path: the
/// authority is the listener's business, never the client's choice of upstream.
pub(crate) fn of<B>(req: &Request<B>) -> Result<Target, ReachError> {
    let uri = req.uri();
    if uri.path() == "*" {
        return if req.method() == Method::OPTIONS && uri.query().is_none() {
            Ok(Target::ServerOptions)
        } else {
            Err(ReachError::BadRequest(
                "the asterisk-form target `*` is only for `OPTIONS *`".to_owned(),
            ))
        };
    }
    match uri.path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => Ok(Target::Path(pq.clone())),
        // Absolute-form with an empty path (`http://host`) means `/`; authority-form (CONNECT's
        // `host:port`) does not: nothing is tunnelled.
        None if uri.scheme().is_some() => Ok(Target::Path(PathAndQuery::from_static("/"))),
        _ => Err(ReachError::BadRequest(format!(
            "request target `{uri}` is not a path (origin-form `/…` expected)"
        ))),
    }
}

/// The answer to `OPTIONS *`: what the listener speaks, nothing forwarded.
pub(crate) fn server_options() -> Response<ReachBody> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response.headers_mut().insert(
        header::ALLOW,
        header::HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: &str, uri: &str) -> Result<Target, ReachError> {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .map_err(|e| ReachError::BadRequest(e.to_string()))?;
        of(&req)
    }

    #[test]
    fn origin_form_passes_and_absolute_form_keeps_only_its_path() {
        assert!(matches!(target("GET", "/a?b=1"), Ok(Target::Path(p)) if p == "/a?b=1"));
        assert!(matches!(target("GET", "http://evil:80/x"), Ok(Target::Path(p)) if p == "/x"));
    }

    #[test]
    fn connect_and_authority_form_are_refused() {
        assert!(matches!(
            target("CONNECT", "evil:443"),
            Err(ReachError::BadRequest(_))
        ));
        assert!(matches!(target("GET", "http://host"), Ok(Target::Path(p)) if p == "/"));
    }

    #[test]
    fn asterisk_form_is_answered_for_options_and_refused_otherwise() {
        assert!(matches!(target("OPTIONS", "*"), Ok(Target::ServerOptions)));
        assert!(matches!(
            target("POST", "*"),
            Err(ReachError::BadRequest(_))
        ));
        assert!(matches!(target("GET", "*"), Err(ReachError::BadRequest(_))));
    }
}
