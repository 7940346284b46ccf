//! [`Server`]: the engine and its HTTP front put together for a program that
//! embeds tether, in one builder: a store, the applications mounted at
//! `/mcp` and `/mcp/NAME`, and then either serve on an address or take an
//! axum [`Router`] to nest beside the program's own routes.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn run(app: Arc<dyn tether_server::McpApp>) -> Result<(), Box<dyn std::error::Error>> {
//! let server = tether_server::Server::builder()
//!     .store("sqlite:/var/lib/my-server/sessions.db")
//!     .mount(app)
//!     .build()
//!     .await?;
//! server.serve("127.0.0.1:8080".parse()?, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! Everything the builder does not set is `tether serve`'s default: the
//! engine's limits ([`EngineConfig`]), the front's ([`HttpConfig`]), no
//! authentication ([`Auth::disabled`]), metrics at `/metrics`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tether_store::{Store, StoreConfig, StoreError, StoreUrl, open_store};

use crate::app::{Endpoints, McpApp, RpcError};
use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::http::{AllowedHosts, Auth, HttpConfig};
use crate::policy::Policed;

/// Why a [`Server`] could not be built or could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// No store was chosen: every session lives in one.
    #[error("no store: choose one with .store(\"sqlite:PATH\"), .store(\"redis://HOST:PORT/DB\") or .store(\"memory\")")]
    NoStore,
    /// No application is mounted anywhere.
    #[error("nothing to serve: mount an application with .mount(app) or .mount_at(\"NAME\", app)")]
    NothingMounted,
    /// The store's URL is not one tether knows, or the store did not open.
    #[error("cannot open store {url}: {source}")]
    Store {
        /// The store as given (a Redis password hidden).
        url: String,
        /// What went wrong.
        source: StoreError,
    },
    /// The address could not be bound, or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// What went wrong.
        source: std::io::Error,
    },
}

enum StoreChoice {
    None,
    Url(String),
    Open(Arc<dyn Store>),
}

/// Builds a [`Server`] (see [`Server::builder`]).
pub struct ServerBuilder {
    store: StoreChoice,
    store_config: StoreConfig,
    root: Option<Arc<dyn McpApp>>,
    named: Vec<(String, Arc<dyn McpApp>)>,
    config: EngineConfig,
    http: HttpConfig,
    auth: Auth,
}

impl ServerBuilder {
    /// The store sessions live in: `sqlite:PATH` (a file, created 0600 in a
    /// 0700 folder: sessions survive a restart), `redis://HOST:PORT/DB` or
    /// `redis+cluster://…` (and several replicas can serve the same
    /// sessions), or `memory` (nothing outlives the process). Checked in
    /// [`ServerBuilder::build`].
    pub fn store(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Url(url.into());
        self
    }

    /// A store the program opened itself (one `Arc` may serve several engines' tests).
    pub fn store_handle(mut self, store: Arc<dyn Store>) -> Self {
        self.store = StoreChoice::Open(store);
        self
    }

    /// The store's knobs (events kept per stream, `strict` durability, the
    /// Redis key prefix); used when the store is given by URL.
    pub fn store_config(mut self, config: StoreConfig) -> Self {
        self.store_config = config;
        self
    }

    /// Serves `app` at `/mcp`.
    pub fn mount(mut self, app: Arc<dyn McpApp>) -> Self {
        self.root = Some(app);
        self
    }

    /// Serves `app` at `/mcp/NAME` as well (a session belongs to the
    /// endpoint it was initialized on).
    pub fn mount_at(mut self, name: impl Into<String>, app: Arc<dyn McpApp>) -> Self {
        self.named.push((name.into(), app));
        self
    }

    /// The engine's limits and timeouts (session TTL, the request timeout,
    /// how many sessions each principal may hold…).
    pub fn engine_config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// The HTTP front's limits: body size, allowed origins and hosts,
    /// timeouts, connections.
    pub fn http_config(mut self, http: HttpConfig) -> Self {
        self.http = http;
        self
    }

    /// Who may call: bearer tokens, OAuth access tokens, policies (default:
    /// no authentication, every request `anonymous`). A policy applies to
    /// every mounted endpoint it covers.
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Opens the store and starts the engine (its reaper, and with a shared
    /// store its lease). Needs a Tokio runtime. What is missing or wrong is
    /// said in the error:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let Err(e) = tether_server::Server::builder().store("memory").build().await else { panic!("built") };
    /// assert_eq!(e.to_string(), "nothing to serve: mount an application with .mount(app) or .mount_at(\"NAME\", app)");
    /// # }
    /// ```
    pub async fn build(self) -> Result<Server, ServerError> {
        let policy = self.auth.policy();
        let members: &[String] = &[];
        let root = match self.root {
            Some(app) => app,
            None if self.named.is_empty() => return Err(ServerError::NothingMounted),
            None => {
                let named: Vec<String> = self.named.iter().map(|(name, _)| format!("/mcp/{name}")).collect();
                let refusal = format!("nothing is served at /mcp; this server serves {}", named.join(", "));
                Arc::new(crate::app::Refuses(RpcError::invalid_request(refusal)))
            }
        };
        let store = match self.store {
            StoreChoice::None => return Err(ServerError::NoStore),
            StoreChoice::Open(store) => store,
            StoreChoice::Url(url) => {
                let parsed: StoreUrl = url.parse().map_err(|source| ServerError::Store { url: url.clone(), source })?;
                open_store(&parsed, self.store_config)
                    .await
                    .map_err(|source| ServerError::Store { url: parsed.to_string(), source })?
            }
        };
        let endpoints = Endpoints::new(Policed::wrap(root, crate::ROOT_ENDPOINT, members, policy));
        for (name, app) in self.named {
            let app = Policed::wrap(app, &name, members, policy);
            endpoints.set(name, app);
        }
        let engine = Engine::with_endpoints(store, endpoints, self.config);
        Ok(Server { engine, auth: self.auth, http: self.http })
    }
}

/// tether's engine and HTTP front, ready to serve (see the module's doc).
pub struct Server {
    engine: Engine,
    auth: Auth,
    http: HttpConfig,
}

impl Server {
    /// A builder with `tether serve`'s defaults and no store yet.
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            store: StoreChoice::None,
            store_config: StoreConfig::default(),
            root: None,
            named: Vec::new(),
            config: EngineConfig::default(),
            http: HttpConfig::default(),
            auth: Auth::disabled(),
        }
    }

    /// The engine (sessions, the store), for the admin API or a test.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `/mcp`, `/mcp/NAME`, `/healthz`, `/readyz` and `/metrics`, with the
    /// `Host` check of [`HttpConfig::allowed_hosts`], to merge or nest in a
    /// program's own axum router. The program then serves it, and calls
    /// [`Server::shutdown`] when it stops, so that open streams are told to
    /// reconnect and the store is flushed.
    pub fn router(&self) -> Router {
        let metrics = crate::http::metrics_router(self.engine.clone());
        crate::http::layered_router(self.engine.clone(), self.auth.clone(), self.http.clone(), metrics)
    }

    /// Serves on `addr` until `shutdown` resolves, then drains (open streams
    /// told to reconnect, requests given the drain timeout) and flushes the
    /// store. On a loopback address with no
    /// [`allowed_hosts`](HttpConfig::allowed_hosts) set, only loopback
    /// names are accepted in `Host` (against DNS rebinding).
    pub async fn serve(self, addr: SocketAddr, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| ServerError::Serve { addr, source })?;
        self.serve_on(listener, shutdown).await
    }

    /// [`Server::serve`] on a listener the program bound itself (port 0 in a test).
    pub async fn serve_on(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let addr = listener.local_addr().map_err(|source| ServerError::Serve { addr: ([0, 0, 0, 0], 0).into(), source })?;
        let mut http = self.http;
        if http.allowed_hosts.is_none() && addr.ip().is_loopback() {
            http.allowed_hosts = Some(AllowedHosts::loopback_and(&[]));
        }
        tracing::info!(%addr, "tether listening on http://{addr}/mcp");
        let metrics = crate::http::metrics_router(self.engine.clone());
        crate::http::serve_with(listener, metrics, self.engine, self.auth, http, shutdown)
            .await
            .map_err(|source| ServerError::Serve { addr, source })
    }

    /// Tells open streams to reconnect, ends held sessions for this process
    /// (they live on in the store) and flushes the store: for a program that
    /// served [`Server::router`] itself. Bounded by the drain timeout.
    pub async fn shutdown(&self) {
        self.engine.shutdown().await;
    }
}
