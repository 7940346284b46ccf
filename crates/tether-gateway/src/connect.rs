//! The one place that picks an upstream's transport: the [`Connector`] of
//! a command (`stdio.rs`) or of a URL (`url.rs`) as configured.

use std::sync::Arc;

use crate::config::{Target, UpstreamConfig};
use crate::connector::Connector;

/// The connector of an upstream as configured.
pub(crate) fn for_config(config: &UpstreamConfig) -> Arc<dyn Connector> {
    match &config.target {
        Target::Command(spec) => Arc::new(crate::stdio::StdioConnector::new(spec.clone(), &config.name, config.init_timeout)),
        Target::Url(spec) => Arc::new(crate::url::UrlConnector::new(spec.clone(), &config.name, config.init_timeout)),
    }
}
