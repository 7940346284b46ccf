//! The process's `tracing` subscriber: the log on stderr (text or JSON),
//! and with `--otlp-endpoint` the layer that exports tether's spans
//! (`tether_server::trace`) over OTLP/HTTP with JSON bodies.
//!
//! The exporter is the SDK's batch span processor: a thread of its own with
//! a bounded queue (2,048 spans; `OTEL_BSP_*` tune it, spans beyond the queue
//! are dropped, never waited for), exporting every 5 s or when 512 are
//! waiting, over a blocking HTTP client, so no request waits on the
//! collector. [`flush`] exports what is left at shutdown.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{EnvFilter, FilterExt as _, LevelFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How long the exit waits for the last spans to reach the collector.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// `--otlp-endpoint URL` as the exporter uses it: an `http(s)` URL, with
/// `/v1/traces` (the OTLP/HTTP traces path) when it names no path of its own.
pub fn parse_endpoint(s: &str) -> Result<String, String> {
    let mut url = reqwest::Url::parse(s.trim())
        .map_err(|e| format!("`{s}` is not a URL ({e}); give the collector's, e.g. http://127.0.0.1:4318"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("`{s}` is not an http(s) URL of an OTLP/HTTP collector, e.g. http://127.0.0.1:4318"));
    }
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/v1/traces");
    }
    Ok(url.to_string())
}

/// The tracer provider exporting to `endpoint` (already [`parse_endpoint`]ed),
/// with service.name `tether`; also installs the W3C trace-context propagator.
pub fn provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("cannot set up the OTLP exporter to {endpoint}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("tether").build())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(provider)
}

/// Installs the subscriber: the log (its filter from `RUST_LOG` or the
/// default) and, with `traces`, the layer exporting tether's spans
/// (whatever the log filter; tether's spans never show in the log, log
/// events are not exported). Turns `tether_server::trace` on when `traces`
/// is given. Without `traces` the subscriber is the log alone, as before.
pub fn init_logging(json: bool, filter: EnvFilter, traces: Option<&SdkTracerProvider>) {
    let Some(provider) = traces else {
        tracing_subscriber::registry().with(filter).with(log_layer(json)).init();
        return;
    };
    let log_filter = filter.and(
        filter_fn(|meta| !(meta.is_span() && meta.target() == tether_server::trace::TARGET))
            .with_max_level_hint(LevelFilter::TRACE),
    );
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("tether"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(
            filter_fn(|meta| meta.is_span() && meta.target() == tether_server::trace::TARGET)
                .with_max_level_hint(LevelFilter::INFO),
        );
    tracing_subscriber::registry().with(log_layer(json).with_filter(log_filter)).with(spans).init();
    tether_server::trace::set_enabled(true);
}

/// The log on stderr: JSON objects (fields flattened) or lines for people.
fn log_layer<S>(json: bool) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if json {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour only for a person at a terminal, never in a host's log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed()
    }
}

/// Exports the spans still queued, waiting at most [`FLUSH_WAIT`].
pub fn flush(provider: &SdkTracerProvider) {
    match provider.shutdown_with_timeout(FLUSH_WAIT) {
        Ok(()) => tracing::info!("traces flushed"),
        Err(e) => tracing::warn!(error = %e, "the last traces may not have reached the collector"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_only_to_a_url_without_one() {
        assert_eq!(parse_endpoint("http://127.0.0.1:4318").unwrap(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(parse_endpoint("http://collector:4318/").unwrap(), "http://collector:4318/v1/traces");
        assert_eq!(parse_endpoint("https://otel.example/api/traces").unwrap(), "https://otel.example/api/traces");
        assert!(parse_endpoint("127.0.0.1:4318").is_err());
        assert!(parse_endpoint("ftp://collector/").is_err());
        assert!(parse_endpoint("not a url").is_err());
    }
}
