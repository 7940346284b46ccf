//! [`Guarded`]: a handler whose panics end only the request that caused
//! them, and whose work on a request ends when the request is cancelled.
//! rmcp runs each request in a task of its own and drops a panicked one
//! without an answer, so the caller would wait until its timeout; here a
//! panic becomes that request's internal error, and the session goes on.
//! rmcp only signals a cancelled request's token, which a handler that never
//! looks at it ignores; here its work is dropped then, so a handler that
//! never answers holds nothing once its call has ended.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use rmcp::ServerHandler;
use rmcp::model::{ClientNotification, ClientRequest, ErrorData, ProtocolVersion, ServerConfig, ServerResult};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, Service};

/// `H` with its panics caught per request and per notification.
pub(crate) struct Guarded<H>(pub(crate) H);

/// What a panic said, for the error the client gets.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("no message")
}

impl<H: ServerHandler> Service<RoleServer> for Guarded<H> {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let cancelled = context.ct.clone();
        let work = AssertUnwindSafe(Service::handle_request(&self.0, request, context)).catch_unwind();
        let outcome = tokio::select! {
            outcome = work => outcome,
            _ = cancelled.cancelled() => return Err(ErrorData::internal_error("the request was cancelled", None)),
        };
        match outcome {
            Ok(answer) => answer,
            Err(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(panic = message, "the rmcp handler panicked while answering a request");
                Err(ErrorData::internal_error(format!("the handler failed while answering: {message}"), None))
            }
        }
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match AssertUnwindSafe(Service::handle_notification(&self.0, notification, context)).catch_unwind().await {
            Ok(done) => done,
            Err(panic) => {
                tracing::error!(panic = panic_message(panic.as_ref()), "the rmcp handler panicked on a notification");
                Ok(())
            }
        }
    }

    fn get_info(&self) -> ServerConfig {
        Service::get_info(&self.0)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Service::supported_protocol_versions(&self.0)
    }
}
