//! Requests routed to the member that owns a name: a call, `prompts/get`,
//! a resource request or a completion goes to its member under the
//! member's own name; a list is a page of the catalog; `logging/setLevel`
//! goes to every member that is up. A name no member offers, or whose
//! member is down, gets an error that says which.

use futures::future::join_all;
use serde_json::{Map, Value, json};
use tether_server::{RawResult, RequestCtx, RpcError, raw_result};

use super::VirtualServer;
use crate::app::Notes;
use crate::catalog::{self, Catalog};
use crate::config::{MemberDown, Naming};

impl VirtualServer {
    /// With `on_member_down = "fail"`: the refusal while a member is down.
    pub(super) fn refuse_if_failing(&self, catalog: &Catalog) -> Result<(), RpcError> {
        match catalog.down.first() {
            Some(&member) if self.config.on_member_down == MemberDown::Fail => Err(self.member_down(member)),
            _ => Ok(()),
        }
    }

    pub(super) fn member_down(&self, member: usize) -> RpcError {
        let name = self.members[member].name();
        RpcError::unavailable(
            format!(
                "member `{name}` of virtual server `{}` cannot be reached now; try again later, or see tether's log for why",
                self.config.name
            ),
            name,
        )
    }

    /// The error for a name no member offers (or whose member is down).
    fn unknown(&self, catalog: &Catalog, what: &str, name: &str) -> RpcError {
        if let Some(member) = catalog.reserved_for(what, name) {
            return self.member_down(member);
        }
        if self.config.names == Naming::Prefix
            && let Some(&member) = catalog
                .down
                .iter()
                .find(|&&m| name.starts_with(&format!("{}{}", self.config.upstreams[m], self.config.separator)))
        {
            return self.member_down(member);
        }
        RpcError::invalid_params(format!(
            "virtual server `{}` offers no {what} `{name}`; list them with {what}s/list",
            self.config.name
        ))
    }

    pub(super) async fn list(
        &self,
        ctx: &RequestCtx,
        key: &str,
        params: Option<&Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        let catalog = self.catalog(ctx).await;
        self.refuse_if_failing(&catalog)?;
        let items = match key {
            "tools" => &catalog.tools,
            "prompts" => &catalog.prompts,
            "resources" => &catalog.resources,
            _ => &catalog.templates,
        };
        let cursor = params.and_then(|p| p.get("cursor")).and_then(Value::as_str);
        let (page, next) = catalog::page(items, cursor, self.config.page_size).map_err(RpcError::invalid_params)?;
        raw_result(&catalog::list_result(key, page, next))
    }

    /// A request for one named thing, sent to its member under its own name.
    pub(super) async fn routed(
        &self,
        ctx: &RequestCtx,
        method: &str,
        mut params: Map<String, Value>,
    ) -> Result<RawResult, RpcError> {
        let catalog = self.catalog(ctx).await;
        self.refuse_if_failing(&catalog)?;
        let text = |p: &Map<String, Value>, k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
        let member = match method {
            "tools/call" | "prompts/get" => {
                let name =
                    text(&params, "name").ok_or_else(|| RpcError::invalid_params(format!("{method} needs params.name")))?;
                let (what, route) = match method {
                    "tools/call" => ("tool", catalog.tool(&name)),
                    _ => ("prompt", catalog.prompt(&name)),
                };
                let route = route.ok_or_else(|| self.unknown(&catalog, what, &name))?;
                params.insert("name".into(), Value::String(route.name.clone()));
                route.member
            }
            "completion/complete" => {
                let reference = params.get_mut("ref").and_then(Value::as_object_mut).ok_or_else(|| {
                    RpcError::invalid_params("completion/complete needs params.ref (a ref/prompt or ref/resource)")
                })?;
                match (text(reference, "type").as_deref(), text(reference, "name"), text(reference, "uri")) {
                    (Some("ref/prompt"), Some(name), _) => {
                        let route = catalog.prompt(&name).ok_or_else(|| self.unknown(&catalog, "prompt", &name))?;
                        reference.insert("name".into(), Value::String(route.name.clone()));
                        route.member
                    }
                    (Some("ref/resource"), _, Some(uri)) => self.owner_of(&catalog, &uri)?,
                    _ => {
                        return Err(RpcError::invalid_params(
                            "completion/complete: params.ref must be a ref/prompt with a name or a ref/resource with a uri",
                        ));
                    }
                }
            }
            _ => {
                let uri = text(&params, "uri").ok_or_else(|| RpcError::invalid_params(format!("{method} needs params.uri")))?;
                self.owner_of(&catalog, &uri)?
            }
        };
        let answer = self.ask(ctx, member, method, Some(params), Notes::Leave).await;
        // A member whose connection died under the call may be down: the
        // lists are read again next time (and the client told if it is).
        if answer.is_err()
            && let Some(session) = ctx.session()
            && !self.members[member].is_live(&session)
        {
            self.lists.changed(member);
        }
        answer
    }

    fn owner_of(&self, catalog: &Catalog, uri: &str) -> Result<usize, RpcError> {
        catalog.resource(uri).ok_or_else(|| {
            RpcError::invalid_params(format!(
                "no member of virtual server `{}` serves resource `{uri}`; list them with resources/list",
                self.config.name
            ))
        })
    }

    /// `logging/setLevel` for every member that is up; answered once.
    pub(super) async fn set_level(&self, ctx: &RequestCtx, params: Option<Map<String, Value>>) -> Result<RawResult, RpcError> {
        let catalog = self.catalog(ctx).await;
        let asked = (0..self.members.len()).filter(|m| !catalog.down.contains(m)).map(|member| {
            let params = params.clone();
            async move { (member, self.ask(ctx, member, "logging/setLevel", params, Notes::None).await) }
        });
        for (member, answer) in join_all(asked).await {
            if let Err(e) = answer {
                tracing::warn!(server = %self.config.name, member = self.members[member].name(), error = %e.message, "logging/setLevel not taken by a member");
            }
        }
        raw_result(&json!({}))
    }
}
