//! Credentials on the wire, with a stand-in for the edge (an interceptor that authenticates
//! and puts the `Principal` into the request extensions, as the real edge does):
//!
//! - mutual TLS end to end: a real rustls handshake against a CA generated at test time, the
//!   client certificate's CN read by `phrony_grpc::peer_subject` and mapped to roles by
//!   `phrony_runtime::MtlsAuthenticator` (mapped subject accepted, no certificate or a
//!   certificate from another CA refused at the handshake, unknown subject UNAUTHENTICATED);
//! - worker restrictions on `Work`: handlers outside the credential's tool patterns refused,
//!   worker ids bound to the credential that registered them first, the allowlist identity
//!   taken from the credential; unverified (local mode) registrations unchanged.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use pb::work_client_msg::Body as Up;
use pb::work_server_msg::Body as Down;
use phrony_auth::{Principal, Role, ToolPattern, Verification};
use phrony_dispatch::{Router, RouterConfig};
use phrony_ledger::Ledger;
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1::runtime_server::RuntimeServer;
use phrony_runtime::MtlsAuthenticator;
use phrony_test_support::pki::TestCa;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Status, Streaming};

const PATIENCE: Duration = Duration::from_secs(10);

/// The test's edge: turns a request into a principal, or refuses it.
type Edge = Arc<dyn Fn(&Request<()>) -> Result<Option<Principal>, Status> + Send + Sync>;

struct Server_ {
    addr: String,
    router: Router,
    _dir: tempfile::TempDir,
    _task: tokio::task::JoinHandle<()>,
}

async fn serve(edge: Edge, tls: Option<ServerTlsConfig>) -> Server_ {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
    let ledger = Ledger::connect(&url).await.unwrap();
    ledger.migrate().await.unwrap();
    let router = Router::new(RouterConfig::default()).unwrap();
    let service = phrony_grpc::RuntimeService::new(ledger, "anonymous", router.clone());
    let runtime = RuntimeServer::with_interceptor(service, move |mut req: Request<()>| {
        if let Some(principal) = edge(&req)? {
            req.extensions_mut().insert(principal);
        }
        Ok(req)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).unwrap();
    }
    let task = tokio::spawn(async move {
        builder
            .add_service(runtime)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    Server_ {
        addr,
        router,
        _dir: dir,
        _task: task,
    }
}

fn register(worker_id: &str, tools: &[(&str, &str)], identity: &str) -> pb::WorkClientMsg {
    pb::WorkClientMsg {
        body: Some(Up::Register(pb::WorkRegister {
            worker_id: worker_id.into(),
            workload_identity: identity.into(),
            image_digest: "sha256:test".into(),
            handlers: tools
                .iter()
                .map(|(tool, version)| pb::WorkHandlerAdvertisement {
                    tool: (*tool).into(),
                    version: (*version).into(),
                    contract_version: "1".into(),
                    max_concurrency: 1,
                    descriptor_hash: String::new(),
                })
                .collect(),
            in_flight: Vec::new(),
        })),
    }
}

/// Opens a Work stream as `as_principal` (a request header the test edge reads) and waits for
/// `registered`; the final status otherwise.
async fn work(
    mut client: RuntimeClient<Channel>,
    as_principal: Option<&str>,
    hello: pb::WorkClientMsg,
) -> Result<
    (
        mpsc::Sender<pb::WorkClientMsg>,
        Streaming<pb::WorkServerMsg>,
    ),
    Status,
> {
    let (up, rx) = mpsc::channel(4);
    up.send(hello).await.unwrap();
    let mut request = Request::new(ReceiverStream::new(rx));
    if let Some(p) = as_principal {
        request
            .metadata_mut()
            .insert("test-principal", p.parse().unwrap());
    }
    let mut down = client.work(request).await?.into_inner();
    let first = tokio::time::timeout(PATIENCE, down.message())
        .await
        .expect("no answer")?;
    match first.and_then(|m| m.body) {
        Some(Down::Registered(_)) => Ok((up, down)),
        other => panic!("expected registered, got {other:?}"),
    }
}

async fn plaintext(addr: &str) -> RuntimeClient<Channel> {
    RuntimeClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// The test edge of the worker tests: `test-principal: NAME` is a verified token principal
/// with the worker role and the tools of [`tools_of`]; no header is local mode.
fn token_edge() -> Edge {
    Arc::new(|req: &Request<()>| {
        let Some(name) = req.metadata().get("test-principal") else {
            return Ok(None);
        };
        let name = name.to_str().unwrap().to_owned();
        Ok(Some(Principal {
            tools: tools_of(&name),
            name,
            verification: Verification::Token,
            roles: BTreeSet::from([Role::Worker]),
            routes: Vec::new(),
        }))
    })
}

fn tools_of(name: &str) -> Vec<ToolPattern> {
    match name {
        "refund-bot" | "refund-bot-2" => {
            vec![ToolPattern::parse("payments.issue-refund@1.*").unwrap()]
        }
        _ => Vec::new(),
    }
}

async fn wait_listed(router: &Router, worker_id: &str) -> phrony_dispatch::WorkerSnapshot {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(w) = router
                .snapshot()
                .workers
                .into_iter()
                .find(|w| w.worker_id == worker_id)
            {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_worker_may_register_only_the_tools_its_credential_allows() {
    let server = serve(token_edge(), None).await;
    let refund = ("payments.issue-refund", "1.0.0");
    let (_up, _down) = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("w1", &[refund], "self/asserted"),
    )
    .await
    .unwrap();
    // The allowlist identity is the credential's name, not what the worker says.
    assert_eq!(
        wait_listed(&server.router, "w1").await.workload_identity,
        "refund-bot"
    );

    let status = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("w2", &[refund, ("crm.lookup", "1.0.0")], ""),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("crm.lookup@1.0.0"), "{status:?}");
    assert!(
        status.message().contains("\"refund-bot\" (token)"),
        "{status:?}"
    );

    let status = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("w3", &[("payments.issue-refund", "2.0.0")], ""),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A credential with no tool patterns serves nothing.
    let status = work(
        plaintext(&server.addr).await,
        Some("nobody"),
        register("w4", &[refund], ""),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("none"), "{status:?}");
    assert!(
        server
            .router
            .snapshot()
            .workers
            .iter()
            .all(|w| w.worker_id == "w1")
    );
}

#[tokio::test]
async fn a_worker_id_stays_with_the_credential_that_registered_it_first() {
    let server = serve(token_edge(), None).await;
    let refund = ("payments.issue-refund", "1.0.0");
    let (up, mut first) = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("refund-worker-1", &[refund], ""),
    )
    .await
    .unwrap();
    wait_listed(&server.router, "refund-worker-1").await;

    // Another credential (allowed the same tools) reusing the id is refused; the registered
    // worker keeps its stream.
    let status = work(
        plaintext(&server.addr).await,
        Some("refund-bot-2"),
        register("refund-worker-1", &[refund], ""),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("\"refund-worker-1\"")
            && status.message().contains("\"refund-bot\" (token)")
            && status.message().contains("\"refund-bot-2\" (token)"),
        "{status:?}"
    );
    // An unverified caller cannot take it over either.
    let status = work(
        plaintext(&server.addr).await,
        None,
        register("refund-worker-1", &[refund], ""),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("(unverified)"), "{status:?}");
    // The first worker still has its stream: a heartbeat is answered.
    up.send(pb::WorkClientMsg {
        body: Some(Up::Heartbeat(pb::WorkHeartbeat {})),
    })
    .await
    .unwrap();
    let ack = tokio::time::timeout(PATIENCE, first.message())
        .await
        .unwrap();
    assert!(
        matches!(
            ack.unwrap().and_then(|m| m.body),
            Some(Down::HeartbeatAck(_))
        ),
        "the registered worker kept its stream"
    );

    // Local mode (no verified credential ever registered the id): anyone takes over, as today.
    let _local = work(
        plaintext(&server.addr).await,
        None,
        register("local-worker", &[refund], ""),
    )
    .await
    .unwrap();
    let _local_again = work(
        plaintext(&server.addr).await,
        None,
        register("local-worker", &[refund], ""),
    )
    .await
    .unwrap();

    // The owner reconnecting takes its stream over, as before.
    let server = serve(token_edge(), None).await;
    let (_up, mut old) = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("w", &[refund], ""),
    )
    .await
    .unwrap();
    let _again = work(
        plaintext(&server.addr).await,
        Some("refund-bot"),
        register("w", &[refund], ""),
    )
    .await
    .unwrap();
    let superseded = tokio::time::timeout(PATIENCE, old.message()).await.unwrap();
    assert_eq!(superseded.unwrap_err().code(), Code::Aborted);
    assert_eq!(
        server.router.worker_owner("w").as_deref(),
        Some("\"refund-bot\" (token)")
    );
}

const ROLES: &str = "
clients:
  refund-worker:
    roles: [worker]
    tools: [\"payments.issue-refund@1.*\"]
";

#[tokio::test]
async fn mutual_tls_maps_the_certificate_subject_to_its_roles() {
    let ca = TestCa::new("phrony test CA");
    let server_cert = ca.server();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&server_cert.cert, &server_cert.key))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()));
    let auth = Arc::new(MtlsAuthenticator::parse(ROLES).unwrap());
    let edge: Edge = Arc::new(move |req: &Request<()>| {
        let subject =
            phrony_grpc::peer_subject(req).map_err(|e| Status::unauthenticated(e.to_string()))?;
        auth.principal(subject.as_deref())
            .map(Some)
            .map_err(|e| Status::unauthenticated(e.to_string()))
    });
    let server = serve(edge, Some(tls)).await;
    let connect = |client: Option<phrony_test_support::pki::Pem>, trust: String| {
        let addr = server.addr.clone();
        async move {
            let mut config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(trust))
                .domain_name("localhost");
            if let Some(c) = client {
                config = config.identity(Identity::from_pem(c.cert, c.key));
            }
            Channel::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(config)
                .unwrap()
                .connect_timeout(PATIENCE)
                .connect()
                .await
                .map(RuntimeClient::new)
        }
    };
    let refund = ("payments.issue-refund", "1.0.0");

    // The mapped subject: its worker role and tools apply (the Work RPC reads the principal).
    let client = connect(Some(ca.client("refund-worker")), ca.cert_pem())
        .await
        .unwrap();
    let (_up, _down) = work(client.clone(), None, register("w1", &[refund], ""))
        .await
        .unwrap();
    assert_eq!(
        server.router.worker_owner("w1").as_deref(),
        Some("\"refund-worker\" (mtls)")
    );
    let status = work(client, None, register("w2", &[("crm.lookup", "1")], ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A subject the roles file does not list: UNAUTHENTICATED naming it.
    let client = connect(Some(ca.client("mallory")), ca.cert_pem())
        .await
        .unwrap();
    let status = work(client, None, register("w3", &[refund], ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("\"mallory\""), "{status:?}");

    // No client certificate, or one from another CA: the handshake itself fails.
    let no_cert = match connect(None, ca.cert_pem()).await {
        Err(_) => None,
        Ok(client) => Some(
            work(client, None, register("w4", &[refund], ""))
                .await
                .unwrap_err(),
        ),
    };
    if let Some(status) = no_cert {
        assert_ne!(status.code(), Code::Ok, "{status:?}");
    }
    let rogue = TestCa::new("rogue CA");
    let other = match connect(Some(rogue.client("refund-worker")), ca.cert_pem()).await {
        Err(_) => None,
        Ok(client) => Some(
            work(client, None, register("w5", &[refund], ""))
                .await
                .unwrap_err(),
        ),
    };
    if let Some(status) = other {
        assert_ne!(status.code(), Code::Ok, "{status:?}");
    }
    assert_eq!(server.router.snapshot().workers.len(), 1);

    // A client that does not trust the runtime's CA does not connect.
    let untrusted = connect(Some(ca.client("refund-worker")), rogue.cert_pem()).await;
    assert!(untrusted.is_err());
}
