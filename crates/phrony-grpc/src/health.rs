//! `grpc.health.v1.Health`: `SERVING` for `""` and `phrony.runtime.v1.Runtime` only while the
//! database takes writes.
//!
//! A background task ([`Health::spawn_monitor`], started by the daemon's assembly in
//! `phrony-runtime`) runs the ledger's write probe ([`Ledger::probe_write`]: a real, durable
//! write, so a SQLite file locked by another process or a full disk counts, not only a database
//! that does not answer) at a configured interval; a failed or slow probe flips both services
//! to `NOT_SERVING` until a later probe succeeds. The monitor also follows the ledger's
//! writable signal ([`Ledger::writable`]): the first write of any request or session that finds
//! the database unavailable flips health at once, without waiting for the next tick, and a
//! successful write flips it back. Shutdown flips both for good. Transitions are logged once,
//! naming the cause; steady states are not.
//!
//! `Check` and `Watch` are the standard protocol (an unknown service is `NOT_FOUND` for Check and
//! `SERVICE_UNKNOWN` for Watch). `List` is the variant the published SDKs call (statuses as a map
//! of enum values), which `tonic-health` does not offer; hence this small implementation over
//! our own copy of `health.proto`.

use std::collections::HashMap;
use std::time::Duration;

use phrony_ledger::Ledger;
use phrony_proto::RUNTIME_SERVICE_NAME;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

/// Code generated from `proto/grpc/health/v1/health.proto`.
pub mod pb {
    #![allow(
        unreachable_pub,
        missing_docs,
        clippy::all,
        clippy::allow_attributes_without_reason,
        clippy::too_many_lines,
        reason = "generated code (tonic's own `#[allow]`s carry no reasons, and its service \
                  dispatch is one long match)"
    )]
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

use pb::health_check_response::ServingStatus;

/// Encoded descriptors of `grpc.health.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/health_descriptor_set.bin"));

/// The services whose status follows the database.
const SERVICES: [&str; 2] = ["", RUNTIME_SERVICE_NAME];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    /// The last write probe (or write) succeeded.
    database_ok: bool,
    /// Shutdown has begun; Watch streams end after reporting it.
    stopping: bool,
}

impl State {
    fn status_of(self, service: &str) -> ServingStatus {
        if !SERVICES.contains(&service) {
            ServingStatus::ServiceUnknown
        } else if self.database_ok && !self.stopping {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    }
}

/// The shared health state: written by the monitor and by shutdown, read by the service.
#[derive(Debug, Clone)]
pub struct Health {
    state: watch::Sender<State>,
}

impl Health {
    /// `NOT_SERVING` until the first successful write probe.
    #[must_use]
    pub fn new() -> Self {
        let (state, _) = watch::channel(State {
            database_ok: false,
            stopping: false,
        });
        Self { state }
    }

    /// Records a probe result; `true` when it changed the status.
    fn set_database_ok(&self, ok: bool) -> bool {
        self.state.send_if_modified(|s| {
            let changed = s.database_ok != ok;
            s.database_ok = ok;
            changed
        })
    }

    /// Reports `NOT_SERVING` from now on and ends Watch streams.
    pub fn set_stopping(&self) {
        self.state
            .send_if_modified(|s| !std::mem::replace(&mut s.stopping, true));
    }

    fn current(&self) -> State {
        *self.state.borrow()
    }

    /// `None` while `SERVING`; otherwise why not, in a few words (the daemon's HTTP readiness
    /// probe answers with it).
    #[must_use]
    pub fn not_serving_reason(&self) -> Option<&'static str> {
        let state = self.current();
        if state.stopping {
            Some("shutting down")
        } else if !state.database_ok {
            Some("the database does not take writes")
        } else {
            None
        }
    }

    /// The gRPC service over this state.
    #[must_use]
    pub fn service(&self) -> pb::health_server::HealthServer<HealthService> {
        pb::health_server::HealthServer::new(HealthService {
            health: self.clone(),
        })
    }

    /// Starts the monitor. The first probe runs immediately. Abort the handle to stop it.
    pub fn spawn_monitor(
        &self,
        ledger: Ledger,
        interval: Duration,
        timeout: Duration,
    ) -> JoinHandle<()> {
        let health = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut writable = ledger.writable();
            let mut signal_open = true;
            loop {
                let problem = tokio::select! {
                    _ = ticker.tick() => {
                        match tokio::time::timeout(timeout, ledger.probe_write()).await {
                            Ok(Ok(())) => None,
                            Ok(Err(e)) => Some(e.to_string()),
                            Err(_) => Some(format!(
                                "the write probe got no answer within {} ms",
                                timeout.as_millis()
                            )),
                        }
                    }
                    changed = writable.changed(), if signal_open => {
                        if changed.is_err() {
                            signal_open = false;
                            continue;
                        }
                        if *writable.borrow_and_update() {
                            None
                        } else {
                            Some(ledger.last_outage().unwrap_or_else(|| {
                                "a database write failed".to_owned()
                            }))
                        }
                    }
                };
                if !health.set_database_ok(problem.is_none()) {
                    continue;
                }
                match problem {
                    None => tracing::info!("database takes writes; health is SERVING"),
                    Some(error) => {
                        tracing::warn!(
                            %error,
                            "database does not take writes; health is NOT_SERVING"
                        );
                    }
                }
            }
        })
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// The `grpc.health.v1.Health` service.
#[derive(Debug)]
pub struct HealthService {
    health: Health,
}

fn response(status: ServingStatus) -> pb::HealthCheckResponse {
    pb::HealthCheckResponse {
        status: status.into(),
    }
}

#[tonic::async_trait]
impl pb::health_server::Health for HealthService {
    async fn check(
        &self,
        request: Request<pb::HealthCheckRequest>,
    ) -> Result<Response<pb::HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        match self.health.current().status_of(&service) {
            ServingStatus::ServiceUnknown => {
                Err(Status::not_found(format!("unknown service {service:?}")))
            }
            status => Ok(Response::new(response(status))),
        }
    }

    async fn list(
        &self,
        _request: Request<pb::HealthListRequest>,
    ) -> Result<Response<pb::HealthListResponse>, Status> {
        let state = self.health.current();
        let statuses: HashMap<String, i32> = SERVICES
            .iter()
            .map(|s| ((*s).to_owned(), state.status_of(s).into()))
            .collect();
        Ok(Response::new(pb::HealthListResponse { statuses }))
    }

    type WatchStream = BoxStream<pb::HealthCheckResponse>;

    async fn watch(
        &self,
        request: Request<pb::HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let rx = self.health.state.subscribe();
        // Each item: the status when it differs from the last one sent. The stream ends after
        // reporting shutdown (or when the state is dropped).
        let stream = futures::stream::unfold(
            (rx, service, None::<ServingStatus>, false),
            |(mut rx, service, last, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let state = *rx.borrow_and_update();
                    let status = state.status_of(&service);
                    if last != Some(status) {
                        let item = Ok(response(status));
                        return Some((item, (rx, service, Some(status), state.stopping)));
                    }
                    if state.stopping || rx.changed().await.is_err() {
                        return None;
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use pb::health_server::Health as _;

    use super::*;

    fn request(service: &str) -> Request<pb::HealthCheckRequest> {
        Request::new(pb::HealthCheckRequest {
            service: service.to_owned(),
        })
    }

    async fn check(service: &HealthService, name: &str) -> Result<ServingStatus, Status> {
        let reply = service.check(request(name)).await?.into_inner();
        Ok(reply.status())
    }

    #[tokio::test]
    async fn check_and_list_follow_the_database_and_shutdown() {
        let health = Health::new();
        let service = HealthService {
            health: health.clone(),
        };
        assert_eq!(
            check(&service, "").await.unwrap(),
            ServingStatus::NotServing
        );

        assert!(health.set_database_ok(true));
        assert!(
            !health.set_database_ok(true),
            "an unchanged status is not a change"
        );
        for name in SERVICES {
            assert_eq!(check(&service, name).await.unwrap(), ServingStatus::Serving);
        }
        let unknown = check(&service, "no.such.Service").await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);

        let list = service
            .list(Request::new(pb::HealthListRequest {}))
            .await
            .unwrap();
        let statuses = list.into_inner().statuses;
        let serving = i32::from(ServingStatus::Serving);
        assert_eq!(
            statuses,
            HashMap::from([
                (String::new(), serving),
                (RUNTIME_SERVICE_NAME.to_owned(), serving)
            ])
        );

        health.set_database_ok(false);
        assert_eq!(
            check(&service, RUNTIME_SERVICE_NAME).await.unwrap(),
            ServingStatus::NotServing
        );
        health.set_database_ok(true);
        health.set_stopping();
        assert_eq!(
            check(&service, "").await.unwrap(),
            ServingStatus::NotServing
        );
    }

    /// Waits (bounded) until the health state's `database_ok` is `want`.
    async fn until_database_ok(health: &Health, want: bool) {
        let mut rx = health.state.subscribe();
        let reached = tokio::time::timeout(
            Duration::from_secs(30),
            rx.wait_for(|s| s.database_ok == want),
        )
        .await;
        assert!(
            matches!(reached, Ok(Ok(_))),
            "health never became database_ok = {want}"
        );
    }

    /// A write that finds the SQLite file locked by another connection turns health
    /// NOT_SERVING at once — the monitor's next probe is an hour away — and the next write that
    /// succeeds turns it SERVING again.
    #[tokio::test]
    async fn a_failed_write_turns_health_not_serving_without_waiting_for_the_probe() {
        use sqlx::{ConnectOptions as _, Executor as _};
        use std::str::FromStr as _;

        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let ledger = Ledger::connect_with(
            &url,
            phrony_ledger::LedgerOptions {
                sqlite_busy_timeout: Duration::from_millis(100),
                probe_busy_timeout: Duration::from_millis(100),
                ..phrony_ledger::LedgerOptions::default()
            },
        )
        .await
        .unwrap();
        ledger.migrate().await.unwrap();
        let health = Health::new();
        let monitor = health.spawn_monitor(
            ledger.clone(),
            Duration::from_secs(3600),
            Duration::from_secs(5),
        );
        until_database_ok(&health, true).await;

        let publish = |version: &str| phrony_ledger::NewAgentVersion {
            namespace: "support".into(),
            name: "refunds".into(),
            version: version.into(),
            owner: "team".into(),
            labels: Default::default(),
            snapshot_json: r#"{"kind":"Agent"}"#.into(),
            content_hash: format!("hash-{version}"),
            actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
        };
        let mut holder = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        holder.execute("BEGIN EXCLUSIVE").await.unwrap();
        let err = ledger
            .publish_agent_version(publish("1.0.0"))
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        until_database_ok(&health, false).await;

        holder.execute("COMMIT").await.unwrap();
        ledger
            .publish_agent_version(publish("1.0.0"))
            .await
            .unwrap();
        until_database_ok(&health, true).await;
        monitor.abort();
    }

    #[tokio::test]
    async fn watch_reports_changes_and_ends_at_shutdown() {
        let health = Health::new();
        let service = HealthService {
            health: health.clone(),
        };
        let mut stream = service.watch(request("")).await.unwrap().into_inner();
        let mut next = async || stream.next().await.map(|r| r.unwrap().status());

        assert_eq!(next().await, Some(ServingStatus::NotServing));
        health.set_database_ok(true);
        assert_eq!(next().await, Some(ServingStatus::Serving));
        health.set_database_ok(false);
        assert_eq!(next().await, Some(ServingStatus::NotServing));
        health.set_database_ok(true);
        assert_eq!(next().await, Some(ServingStatus::Serving));
        health.set_stopping();
        assert_eq!(next().await, Some(ServingStatus::NotServing));
        assert_eq!(next().await, None, "the stream ends at shutdown");

        let mut unknown = service.watch(request("nope")).await.unwrap().into_inner();
        let first = unknown.next().await.unwrap().unwrap();
        assert_eq!(first.status(), ServingStatus::ServiceUnknown);
    }
}
