//! HAProxy's and Envoy's configuration, and how a changed address reaches them.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// One command on HAProxy's runtime API; its answer must not be an error.
pub(crate) fn haproxy_command(socket: &Path, command: &str) -> Result<(), String> {
    use std::io::Read as _;
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    if answer.to_ascii_lowercase().contains("error") || answer.contains("No such") {
        return Err(format!("haproxy `{command}`: {}", answer.trim()));
    }
    Ok(())
}

pub(crate) fn envoy_endpoints(endpoints: &[SocketAddr], indent: &str) -> String {
    endpoints
        .iter()
        .map(|a| {
            format!(
                "{indent}- endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                a.ip(),
                a.port()
            )
        })
        .collect()
}

/// The EDS file, replaced whole by a rename so Envoy's directory watch sees one change.
pub(crate) fn write_eds(path: &Path, endpoints: &[SocketAddr]) -> Result<(), String> {
    let text = format!(
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n  cluster_name: agents\n  endpoints:\n  - lb_endpoints:\n{}",
        envoy_endpoints(endpoints, "    ")
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

pub(crate) fn envoy_config(port: u16, endpoints: &[SocketAddr], eds: Option<&Path>) -> String {
    let discovery = match eds {
        Some(path) => format!(
            "    type: EDS\n    eds_cluster_config:\n      eds_config:\n        resource_api_version: V3\n        path_config_source:\n          path: {}\n          watched_directory: {{ path: {} }}\n",
            path.display(),
            path.parent().map_or(String::new(), |d| d.display().to_string())
        ),
        None => format!(
            "    type: STATIC\n    load_assignment:\n      cluster_name: agents\n      endpoints:\n      - lb_endpoints:\n{}",
            envoy_endpoints(endpoints, "        ")
        ),
    };
    let retry = r#"                    retry_on: "5xx,reset,connect-failure,retriable-status-codes"
                    retriable_status_codes: [429]
                    num_retries: 1
"#;
    let cluster = format!(
        r#"    lb_policy: ROUND_ROBIN
    round_robin_lb_config: {{ slow_start_config: {{ slow_start_window: 30s }} }}
    circuit_breakers: {{ thresholds: [ {{ retry_budget: {{ budget_percent: {{ value: 20 }}, min_retry_concurrency: 3 }} }} ] }}
    health_checks:
    - timeout: 2s
      interval: 10s
      unhealthy_threshold: 3
      healthy_threshold: 2
      no_traffic_interval: 10s
      http_health_check: {{ path: /healthz }}
    outlier_detection:
      consecutive_5xx: 5
      consecutive_gateway_failure: 5
      interval: 1s
      base_ejection_time: 30s
      max_ejection_percent: 50
{discovery}"#
    );
    envoy_bootstrap("scenario", port, "", retry, &cluster)
}

/// An Envoy bootstrap for a scenario: one listener on `port` sending every request to the
/// cluster `agents`. `hedge` is added to its virtual host; `retry` opens its route's retry
/// policy, which always avoids the host just tried; `cluster` follows the cluster's name and
/// connect timeout. Each is written as it stands in the file (`hedge` indented 14 spaces,
/// `retry` 20, `cluster` 4), a line break after each line.
pub(crate) fn envoy_bootstrap(
    id: &str,
    port: u16,
    hedge: &str,
    retry: &str,
    cluster: &str,
) -> String {
    let stat_prefix = id.replace('-', "_");
    format!(
        r#"
node: {{ id: {id}, cluster: {id} }}
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {stat_prefix}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
{hedge}              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: agents
                  timeout: 10s
                  retry_policy:
{retry}                    retry_host_predicate: [ {{ name: envoy.retry_host_predicates.previous_hosts, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate }} }} ]
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: agents
    connect_timeout: 1s
{cluster}"#
    )
}
