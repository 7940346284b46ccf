//! A TCP proxy of the tests' own between one replica and Redis (or one
//! Redis and its replica): it passes bytes both ways, or delays them, or
//! cuts every connection and refuses new ones (a partition of that replica
//! alone: the other replicas have proxies of their own); it can be pointed
//! at another server, cutting what it holds (an address that moves to a
//! promoted replica at a failover). Real sockets; the replica's Redis
//! client sees exactly what a broken network shows it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Every chunk waits this long before it is passed on.
    Delay(Duration),
    /// Open connections are cut and new ones closed at once.
    Partition,
    /// Nothing passes and nothing is closed: bytes wait (TCP would
    /// retransmit them) until the mode changes, as when a network drops
    /// every packet for a while.
    Blackhole,
}

pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    upstream: Arc<parking_lot::Mutex<SocketAddr>>,
    /// Bumped to cut every open connection (see [`Proxy::retarget`]).
    cuts: watch::Sender<u64>,
    /// Connections accepted, for the report.
    pub accepted: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on a loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (mode, watching) = watch::channel(Mode::Pass);
        let (cuts, cut_watch) = watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let upstream = Arc::new(parking_lot::Mutex::new(upstream));
        let target = upstream.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                let mode = watching.clone();
                if *mode.borrow() == Mode::Partition {
                    drop(client);
                    continue;
                }
                let upstream = *target.lock();
                let mut cut = cut_watch.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        () = pump(client_read, server_write, mode.clone()) => {}
                        () = pump(server_read, client_write, mode.clone()) => {}
                        () = partitioned(mode) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy { addr, mode, upstream, cuts, accepted }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Points new connections at `upstream` and cuts the open ones.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock() = upstream;
        self.cuts.send_modify(|n| *n += 1);
    }

    /// A Redis URL through this proxy, keeping the database of `url`.
    pub fn url(&self, url: &str) -> String {
        let rest = url.strip_prefix("redis://").unwrap_or(url);
        let db = rest.split_once('/').map_or("", |(_, db)| db);
        format!("redis://{}/{db}", self.addr)
    }
}

/// The address of the Redis at `url` (`redis://HOST:PORT/DB`).
pub async fn redis_addr(url: &str) -> SocketAddr {
    let rest = url.strip_prefix("redis://").unwrap_or(url);
    let host = rest.split('/').next().unwrap_or("127.0.0.1:6379");
    let host = host.rsplit('@').next().unwrap_or(host);
    tokio::net::lookup_host(host).await.ok().and_then(|mut a| a.next()).expect("the Redis address resolves")
}

async fn partitioned(mut mode: watch::Receiver<Mode>) {
    loop {
        if *mode.borrow_and_update() == Mode::Partition {
            return;
        }
        if mode.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut mode = mode.clone();
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Delay(d) => tokio::time::sleep(d).await,
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                // What waited in a blackhole is dropped with the cut, never
                // passed on: a partition passes nothing.
                Mode::Partition => return,
                Mode::Pass => {}
            }
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
