//! Where a task's `reach-callback` may point. A callback is a URL the caller names and the
//! sidecar then POSTs to, so without a policy it is a way to make the sidecar reach anything
//! its pod can: cloud metadata on link-local addresses, the sidecar's own admin port, a
//! password carried in the URL. So:
//!
//! - at submission (`check`): only `http(s)://` URLs without userinfo, to a host on the policy's
//!   `callbacks.allow_hosts` (empty by default: callbacks are off), never to a link-local or the
//!   unspecified address, never to this sidecar's own listener ports. Nothing is resolved here:
//!   an IP literal is checked as written, a name against the list.
//! - at delivery (`Guarded`, the callback client's connector): the same check against the live
//!   policy, then the name is resolved and every address it resolves to is screened before one
//!   is dialled, so a name that resolves (or rebinds) to a forbidden address is refused.
//!   `docs/tasks.md`, "Callbacks".

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::{Host, Listen, Policy};

/// Why a callback URL is refused: at submission a `400 callback_refused`, at delivery the
/// reason the delivery was given up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("`reach-callback` must be an absolute http:// or https:// URL")]
    NotHttp,
    // The URL is not echoed: it holds the password.
    #[error("`reach-callback` must not carry a user name or password (`user:pass@`)")]
    Userinfo,
    #[error("`reach-callback` host `{0}` is not a host name or an IP address")]
    BadHost(String),
    #[error("`reach-callback` host `{host}` is {why}: never a callback destination, whatever `callbacks.allow_hosts` says")]
    Forbidden { host: String, why: &'static str },
    #[error("`reach-callback` {host}:{port} is this sidecar's own {listener} listener: never a callback destination")]
    OwnListener {
        host: String,
        port: u16,
        listener: &'static str,
    },
    #[error("callbacks are off: the policy lists no `callbacks.allow_hosts`")]
    Off,
    #[error("`reach-callback` host `{host}` (port {port}) is not in the policy's `callbacks.allow_hosts`")]
    NotAllowed { host: String, port: u16 },
    #[error("callbacks are not available until the sidecar has started; try again")]
    NotReady,
    #[error("`reach-callback` host `{host}` resolves to {addr}, which is {why}")]
    Resolved {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
}

/// The address a packet to `ip` really goes to: an IPv4-mapped (`::ffff:a.b.c.d`) or NAT64
/// (`64:ff9b::a.b.c.d`) address is its IPv4 address.
fn effective(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// Why `ip` is never a callback destination, if it is not.
pub(crate) fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match effective(ip) {
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address (169.254.0.0/16)"),
        // 0.0.0.0/8 is "this network": 0.0.0.0 reaches the host itself.
        IpAddr::V4(v4) if v4.octets()[0] == 0 => Some("the unspecified address"),
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            Some("a link-local address (fe80::/10)")
        }
        IpAddr::V6(v6) if v6.is_unspecified() => Some("the unspecified address"),
        _ => None,
    }
}

/// The listener of this sidecar that `port` names, when the bootstrap fixes its port (`0`: the
/// OS chose one, which the bootstrap does not know).
fn listener_on(port: u16, listen: &Listen) -> Option<(&'static str, SocketAddr)> {
    [
        ("outbound", listen.outbound),
        ("inbound", listen.inbound),
        ("admin", listen.admin),
    ]
    .into_iter()
    .find(|(_, addr)| addr.port() != 0 && addr.port() == port)
}

/// Whether `ip:port` is one of this sidecar's listeners: its port, on loopback, on the IP the
/// listener is bound to, or on any address of this host.
fn own_listener(ip: IpAddr, port: u16, listen: &Listen) -> Option<&'static str> {
    let (name, bound) = listener_on(port, listen)?;
    let ip = effective(ip);
    // Binding succeeds only on an address this host holds: a local check, no lookup.
    let ours = ip.is_loopback()
        || effective(bound.ip()) == ip
        || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok();
    ours.then_some(name)
}

fn is_localhost(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

/// Checks a callback URL against the rules and `policy.callbacks` (at submission, and again
/// before each delivery: the policy is live).
pub(crate) fn check(url: &str, policy: &Policy, listen: &Listen) -> Result<(), Refused> {
    let uri: Uri = url.parse().map_err(|_| Refused::NotHttp)?;
    let https = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => false,
        Some(s) if s.eq_ignore_ascii_case("https") => true,
        _ => return Err(Refused::NotHttp),
    };
    let authority = uri.authority().ok_or(Refused::NotHttp)?;
    if authority.as_str().contains('@') {
        return Err(Refused::Userinfo);
    }
    let raw = authority.host();
    let host = Host::parse(raw).map_err(|_| Refused::BadHost(raw.to_owned()))?;
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let own = match &host {
        Host::Ip(ip) => {
            if let Some(why) = forbidden(*ip) {
                return Err(Refused::Forbidden {
                    host: host.to_string(),
                    why,
                });
            }
            own_listener(*ip, port, listen)
        }
        Host::Name(name) if is_localhost(name) => listener_on(port, listen).map(|(n, _)| n),
        Host::Name(_) => None,
    };
    if let Some(listener) = own {
        return Err(Refused::OwnListener {
            host: host.to_string(),
            port,
            listener,
        });
    }
    let callbacks = &policy.callbacks;
    if callbacks.allow_hosts.is_empty() {
        return Err(Refused::Off);
    }
    if !callbacks.allows(&host, port) {
        return Err(Refused::NotAllowed {
            host: host.to_string(),
            port,
        });
    }
    Ok(())
}

/// Screens what `host` resolved to: every address must be one a callback may reach.
pub(crate) fn screen(host: &str, addrs: &[SocketAddr], listen: &Listen) -> Result<(), Refused> {
    for addr in addrs {
        let why = forbidden(addr.ip()).or_else(|| {
            own_listener(addr.ip(), addr.port(), listen)
                .map(|_| "this sidecar's own listener on that port")
        });
        if let Some(why) = why {
            return Err(Refused::Resolved {
                host: host.to_owned(),
                addr: addr.ip(),
                why,
            });
        }
    }
    Ok(())
}

/// The refusal somewhere in an error's chain (the connector's, wrapped by hyper).
pub(crate) fn refusal(err: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return Some(refused.clone());
        }
        next = e.source();
    }
    None
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The callback client's TCP connector: resolves the host itself and screens every address
/// before dialling one, so what is checked is what is connected to (no second lookup that a
/// rebinding name could answer differently).
#[derive(Clone, Debug)]
pub(crate) struct Guarded {
    listen: Arc<Listen>,
}

impl Guarded {
    pub(crate) fn new(listen: Listen) -> Self {
        Self {
            listen: Arc::new(listen),
        }
    }
}

impl tower::Service<Uri> for Guarded {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let listen = self.listen.clone();
        Box::pin(async move {
            let raw = uri.host().unwrap_or_default();
            let host = raw
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(raw)
                .to_owned();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            // Boxed as itself, so `refusal` finds it in hyper's error chain.
            screen(&host, &addrs, &listen)?;
            let mut last: Option<std::io::Error> = None;
            for addr in addrs {
                match TcpStream::connect(addr).await {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(TokioIo::new(stream));
                    }
                    Err(err) => last = Some(err),
                }
            }
            Err(match last {
                Some(err) => err.into(),
                None => format!("`{host}` resolved to no address").into(),
            })
        })
    }
}

/// `url` with any `user:pass@` replaced by `***@`, for views (such a callback is refused, but a
/// task stored before the check, or an operator's webhook, may hold one).
pub(crate) fn mask_userinfo(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_policy;

    fn listen() -> Listen {
        Listen {
            outbound: "127.0.0.1:4140".parse().unwrap(),
            inbound: "0.0.0.0:4143".parse().unwrap(),
            admin: "0.0.0.0:4191".parse().unwrap(),
            intercept: Default::default(),
        }
    }

    fn policy(hosts: &str) -> Policy {
        let text = format!("callbacks: {{ allow_hosts: {hosts} }}\n");
        parse_policy(std::path::Path::new("p.yaml"), &text).unwrap()
    }

    fn verdict(url: &str, hosts: &str) -> Result<(), Refused> {
        check(url, &policy(hosts), &listen())
    }

    #[test]
    fn callbacks_are_off_until_hosts_are_listed() {
        assert_eq!(
            check("http://hooks.example.com/x", &Policy::default(), &listen()),
            Err(Refused::Off)
        );
        assert_eq!(
            verdict("http://hooks.example.com/x", "[hooks.example.com]"),
            Ok(())
        );
    }

    #[test]
    fn names_ports_wildcards_and_ips_match_as_written() {
        let hosts = r#"["hooks.example.com", "10.0.0.5:9000", "*.example.org", "fd00::7"]"#;
        for ok in [
            "https://hooks.example.com/a?b=c",
            "http://HOOKS.example.com.:8080/",
            "http://10.0.0.5:9000/done",
            "https://a.example.org/",
            "https://a.b.example.org:444/",
            "http://[fd00::7]/",
        ] {
            assert_eq!(verdict(ok, hosts), Ok(()), "{ok}");
        }
        for refused in [
            "http://example.org/",
            "http://badexample.org/",
            "http://10.0.0.5/",
            "http://10.0.0.5:9001/",
            "http://10.0.0.6:9000/",
            "http://[::ffff:10.0.0.5]:9000/",
            "http://other.example.com/",
        ] {
            assert!(
                matches!(verdict(refused, hosts), Err(Refused::NotAllowed { .. })),
                "{refused}: {:?}",
                verdict(refused, hosts)
            );
        }
    }

    #[test]
    fn some_destinations_are_refused_even_when_listed() {
        let hosts = r#"["169.254.169.254", "fe80::1", "0.0.0.0", "127.0.0.1", "localhost", "u"]"#;
        let forbidden = |url: &str| matches!(verdict(url, hosts), Err(Refused::Forbidden { .. }));
        assert!(forbidden("http://169.254.169.254/latest/meta-data/"));
        assert!(forbidden("http://[fe80::1]/"));
        assert!(forbidden("http://[::ffff:169.254.169.254]/"));
        assert!(forbidden("http://[64:ff9b::a9fe:a9fe]/"));
        assert!(forbidden("http://0.0.0.0:8080/"));
        assert!(forbidden("http://[::]/"));
        assert_eq!(
            verdict("http://u:secret@127.0.0.1:8080/", hosts),
            Err(Refused::Userinfo)
        );
        assert!(!Refused::Userinfo.to_string().contains("secret"));
        for own in [
            "http://127.0.0.1:4140/",
            "http://127.0.0.1:4191/",
            "http://127.9.9.9:4143/",
            "http://localhost:4191/",
            "http://[::1]:4191/",
        ] {
            assert!(
                matches!(verdict(own, hosts), Err(Refused::OwnListener { .. })),
                "{own}: {:?}",
                verdict(own, hosts)
            );
        }
        assert_eq!(verdict("http://127.0.0.1:8080/done", hosts), Ok(()));
        assert_eq!(verdict("ftp://127.0.0.1/", hosts), Err(Refused::NotHttp));
        assert_eq!(verdict("/relative", hosts), Err(Refused::NotHttp));
        // Numeric forms a resolver reads as IPv4 are not names.
        for numeric in [
            "http://127.1:4191/",
            "http://2852039166/",
            "http://0xa9fea9fe/",
        ] {
            assert!(
                matches!(verdict(numeric, hosts), Err(Refused::BadHost(_))),
                "{numeric}"
            );
        }
    }

    #[tokio::test]
    async fn the_connector_refuses_what_a_host_resolves_to() {
        let mut guarded = Guarded::new(listen());
        for url in [
            "http://169.254.169.254/",
            "http://[fe80::1]:80/",
            "http://127.0.0.1:4191/",
        ] {
            let uri: Uri = url.parse().unwrap();
            let err = match tower::Service::call(&mut guarded, uri).await {
                Ok(_) => panic!("{url} was dialled"),
                Err(err) => err,
            };
            assert!(
                matches!(refusal(err.as_ref()), Some(Refused::Resolved { .. })),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn userinfo_is_masked_in_views() {
        assert_eq!(
            mask_userinfo("https://u:p@hooks.example.com/a@b"),
            "https://***@hooks.example.com/a@b"
        );
        assert_eq!(mask_userinfo("http://h/x"), "http://h/x");
    }
}
