//! The seeded fault schedule and the hands that inject each fault. Faults run one after
//! another (a partition holds the schedule for its whole length); each restores what it broke
//! before the next starts, and records its window on the run's clock.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::fleet::{Fleet, Partition, Redis, Tmpfs};
use super::net::now_ms;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// SIGKILL of a sidecar, restarted on the same files and ports.
    KillSidecar,
    /// SIGTERM of a sidecar: it drains and exits; then restarted.
    TermSidecar,
    /// SIGKILL of a mock agent, restarted on its port.
    KillAgent,
    /// A worker's sidecar cut off (iptables DROP on its inbound and gossip ports).
    Partition,
    /// The file task store's disk filled, then freed.
    DiskFull,
    /// `redis-server` killed and started again on its port and append-only file.
    RedisRestart,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::KillSidecar,
        Kind::TermSidecar,
        Kind::KillAgent,
        Kind::Partition,
        Kind::DiskFull,
        Kind::RedisRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::KillSidecar => "sigkill-sidecar",
            Kind::TermSidecar => "sigterm-sidecar",
            Kind::KillAgent => "sigkill-agent",
            Kind::Partition => "partition",
            Kind::DiskFull => "disk-full",
            Kind::RedisRestart => "redis-restart",
        }
    }

    /// How often it is drawn once every available kind has had its turn.
    fn weight(self) -> u32 {
        match self {
            Kind::KillSidecar => 4,
            Kind::TermSidecar => 3,
            Kind::KillAgent => 3,
            Kind::Partition => 1,
            Kind::DiskFull => 1,
            Kind::RedisRestart => 1,
        }
    }
}

/// A fault as it happened.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: Kind,
    /// The sidecar, agent, `redis` or store it hit.
    pub target: String,
    pub start_ms: u64,
    /// For a SIGTERM: when the process had exited (the drain is `start_ms..exited_ms`).
    pub exited_ms: Option<u64>,
    /// When what it broke was back (restarted, healed, freed).
    pub end_ms: u64,
    pub note: String,
    /// For a store fault: the task store's sidecar and the probe task it accepted once the
    /// store was back (None: it accepted none within [`HEAL_WITHIN`] — the store did not heal).
    pub healed: Option<(String, Option<String>)>,
}

/// How long a task store may take to accept a task again once its disk or Redis is back.
pub const HEAL_WITHIN: Duration = Duration::from_secs(20);

/// A fault to inject: what, where, after which pause, held how long.
#[derive(Clone, Debug)]
pub struct Planned {
    pub kind: Kind,
    pub target: String,
    pub gap: Duration,
    pub hold: Duration,
}

/// What the faults may hit.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// Sidecars that may be killed or terminated (workers and task callers, not the seed).
    pub sidecars: Vec<String>,
    /// Workers' sidecars: what a partition cuts off.
    pub workers: Vec<String>,
    pub agents: Vec<String>,
    /// The file store's sidecar (disk full).
    pub disk: Option<String>,
    pub redis: bool,
}

/// Which kinds can run here, and why the others cannot.
pub fn available(
    targets: &Targets,
    partition: Result<(), String>,
    disk: Result<(), String>,
) -> (Vec<Kind>, BTreeMap<Kind, String>) {
    let mut skipped = BTreeMap::new();
    let mut kinds = Vec::new();
    for kind in Kind::ALL {
        let why = match kind {
            Kind::KillSidecar | Kind::TermSidecar if targets.sidecars.is_empty() => {
                Some("no sidecar to hit".to_owned())
            }
            Kind::KillAgent if targets.agents.is_empty() => Some("no agent".to_owned()),
            Kind::Partition if targets.workers.is_empty() => Some("no worker".to_owned()),
            Kind::Partition => partition.clone().err(),
            Kind::DiskFull if targets.disk.is_none() => Some("no file store".to_owned()),
            Kind::DiskFull => disk.clone().err(),
            Kind::RedisRestart if !targets.redis => {
                Some("redis-server is not installed".to_owned())
            }
            _ => None,
        };
        match why {
            Some(why) => {
                skipped.insert(kind, why);
            }
            None => kinds.push(kind),
        }
    }
    (kinds, skipped)
}

/// `n` faults from `seed`: every available kind once (in a seeded order), then drawn by weight.
pub fn plan(
    seed: u64,
    n: usize,
    kinds: &[Kind],
    targets: &Targets,
    gap_ms: (u64, u64),
    partition: Duration,
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<Kind> = kinds.to_vec();
    // Fisher–Yates with the seeded RNG.
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let total: u32 = kinds.iter().map(|k| k.weight()).sum();
    while order.len() < n && total > 0 {
        let mut draw = rng.random_range(0..total);
        for k in kinds {
            if draw < k.weight() {
                order.push(*k);
                break;
            }
            draw -= k.weight();
        }
    }
    order.truncate(n);
    let pick = |rng: &mut StdRng, from: &[String]| from[rng.random_range(0..from.len())].clone();
    // A SIGKILL or SIGTERM hits a task caller first (its restart and its drain of the calls it
    // holds matter most), then a worker, and so on in turn.
    let callers: Vec<String> = targets
        .sidecars
        .iter()
        .filter(|s| !targets.workers.contains(s))
        .cloned()
        .collect();
    let mut turns: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut sidecar = |rng: &mut StdRng, kind: Kind| {
        let turn = turns.entry(kind).or_default();
        *turn += 1;
        let from = if *turn % 2 == 1 && !callers.is_empty() {
            &callers
        } else if !targets.workers.is_empty() {
            &targets.workers
        } else {
            &targets.sidecars
        };
        pick(rng, from)
    };
    order
        .into_iter()
        .map(|kind| {
            let gap = Duration::from_millis(rng.random_range(gap_ms.0..=gap_ms.1));
            let (target, hold) = match kind {
                Kind::KillSidecar => (sidecar(&mut rng, kind), ms(&mut rng, 200, 800)),
                Kind::TermSidecar => (sidecar(&mut rng, kind), ms(&mut rng, 100, 500)),
                Kind::KillAgent => (pick(&mut rng, &targets.agents), ms(&mut rng, 300, 1500)),
                Kind::Partition => (pick(&mut rng, &targets.workers), partition),
                Kind::DiskFull => (
                    targets.disk.clone().unwrap_or_default(),
                    ms(&mut rng, 3000, 5000),
                ),
                Kind::RedisRestart => ("redis".to_owned(), ms(&mut rng, 200, 800)),
            };
            Planned {
                kind,
                target,
                gap,
                hold,
            }
        })
        .collect()
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// What the hands reach.
pub struct Hands<'a> {
    pub fleet: &'a mut Fleet,
    pub redis: Option<&'a mut Redis>,
    pub tmpfs: Option<&'a Tmpfs>,
    /// The sidecars whose task store lives on the tmpfs and in Redis.
    pub disk_store: Option<String>,
    pub redis_store: Option<String>,
}

/// Injects one fault and restores what it broke; a restart that fails is an error (the run
/// cannot go on).
pub async fn inject(hands: &mut Hands<'_>, planned: &Planned) -> Result<Fault, String> {
    let start_ms = now_ms();
    let mut exited_ms = None;
    let mut healed = None;
    let note = match planned.kind {
        Kind::KillSidecar => {
            let i = sidecar(hands.fleet, &planned.target)?;
            hands.fleet.sidecars[i].kill9();
            tokio::time::sleep(planned.hold).await;
            restart(hands.fleet, i).await?;
            format!("down {} ms", planned.hold.as_millis())
        }
        Kind::TermSidecar => {
            let i = sidecar(hands.fleet, &planned.target)?;
            let s = &mut hands.fleet.sidecars[i];
            s.sigterm()?;
            let status = s.wait_exit(Duration::from_secs(30)).await;
            exited_ms = Some(now_ms());
            tokio::time::sleep(planned.hold).await;
            restart(hands.fleet, i).await?;
            match status {
                Some(status) => format!(
                    "drained and exited ({status}) in {} ms",
                    exited_ms.unwrap_or(start_ms) - start_ms
                ),
                None => "did not exit within 30 s of SIGTERM: killed".to_owned(),
            }
        }
        Kind::KillAgent => {
            let i = hands
                .fleet
                .agent(&planned.target)
                .ok_or_else(|| format!("no agent {}", planned.target))?;
            hands.fleet.agents[i].kill9();
            tokio::time::sleep(planned.hold).await;
            let mut last = String::new();
            for _ in 0..3 {
                match hands.fleet.agents[i].start().await {
                    Ok(()) => {
                        last.clear();
                        break;
                    }
                    Err(e) => last = e,
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if !last.is_empty() {
                return Err(last);
            }
            format!("down {} ms", planned.hold.as_millis())
        }
        Kind::Partition => {
            let i = sidecar(hands.fleet, &planned.target)?;
            let s = &hands.fleet.sidecars[i];
            let tag = format!("agent-reach-chaos-{}", std::process::id());
            let mut cut = Partition::cut(&[s.inbound.port()], &[s.gossip.port()], &tag)?;
            tokio::time::sleep(planned.hold).await;
            cut.heal();
            format!(
                "inbound :{} and gossip :{} dropped for {} s",
                s.inbound.port(),
                s.gossip.port(),
                planned.hold.as_secs()
            )
        }
        Kind::DiskFull => {
            let tmpfs = hands.tmpfs.ok_or("no tmpfs")?;
            let filled = tmpfs.fill()?;
            tokio::time::sleep(planned.hold).await;
            tmpfs.free();
            let store = hands.disk_store.clone().unwrap_or_default();
            let (probe, took) = heal(hands.fleet, &store, start_ms).await;
            healed = Some((store, probe));
            format!(
                "{} KiB written until ENOSPC, held {} ms, freed; {took}",
                filled / 1024,
                planned.hold.as_millis()
            )
        }
        Kind::RedisRestart => {
            let redis = hands.redis.as_deref_mut().ok_or("no redis")?;
            redis.kill9();
            tokio::time::sleep(planned.hold).await;
            redis.spawn().await?;
            let store = hands.redis_store.clone().unwrap_or_default();
            let (probe, took) = heal(hands.fleet, &store, start_ms).await;
            healed = Some((store, probe));
            format!(
                "down {} ms (append-only, fsync always); {took}",
                planned.hold.as_millis()
            )
        }
    };
    Ok(Fault {
        kind: planned.kind,
        target: planned.target.clone(),
        start_ms,
        exited_ms,
        end_ms: now_ms(),
        note,
        healed,
    })
}

/// Submits a probe task to `store`'s sidecar (under one key) until it is accepted or
/// [`HEAL_WITHIN`] has passed: the accepted id, and how long that took.
async fn heal(fleet: &Fleet, store: &str, tag: u64) -> (Option<String>, String) {
    let Some(i) = fleet.sidecar(store) else {
        return (None, format!("no sidecar {store}"));
    };
    let outbound = fleet.sidecars[i].outbound;
    let key = format!("heal-probe-{tag}");
    let began = std::time::Instant::now();
    let mut last = String::new();
    while began.elapsed() < HEAL_WITHIN {
        let answer = super::net::call(
            outbound,
            "POST",
            "/review",
            &[
                ("reach-capability", super::load::CAP),
                ("prefer", "respond-async"),
                ("idempotency-key", &key),
            ],
            "{\"heal\": 1}",
            Duration::from_secs(10),
        )
        .await;
        match answer {
            Ok(a) if a.status == 202 => {
                let id = a.json()["id"].as_str().map(str::to_owned);
                return (
                    id,
                    format!(
                        "{store} accepted a task again {} ms later",
                        began.elapsed().as_millis()
                    ),
                );
            }
            Ok(a) => last = format!("{} {}", a.status, a.reason()),
            Err(f) => last = f.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (
        None,
        format!(
            "{store} accepted no task within {} s (last: {last}): its store did not heal",
            HEAL_WITHIN.as_secs()
        ),
    )
}

fn sidecar(fleet: &Fleet, name: &str) -> Result<usize, String> {
    fleet
        .sidecar(name)
        .ok_or_else(|| format!("no sidecar {name}"))
}

/// Starts a sidecar again, a few times if its ports are slow to free.
async fn restart(fleet: &mut Fleet, i: usize) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..3 {
        match fleet.sidecars[i].start().await {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}
