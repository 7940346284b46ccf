//! [`Catalog`]: a virtual server's members' tools, prompts, resources and
//! resource templates merged into the lists one client sees, and the route
//! back from every merged name or URI to the member that owns it.
//!
//! The rules (see [`ServerConfig`]): names are made (`prefix`: the member's
//! name, the separator, its own name; `priority` and `none`: its own name),
//! then tools are kept by `allow`, renamed by `rename` and described by
//! `describe`. Two members may not offer one name. At first sight, under
//! `priority` the member listed first takes it; otherwise the collision is
//! a [`Collision`], which refuses a start. Once a name is held, it stays
//! with the member that holds it: a merge after a member's list changed is
//! given the catalog before it, and a member that newly offers a name
//! another holds never takes it (whatever the priority), and the contest
//! is a [`Collision`] (logged, shown to operators). Resource URIs are not
//! renamed; a URI two members list is a collision the same way. A member
//! that could not be listed is left out ([`Catalog::down`]).
//!
//! A catalog is also where policies learn what a merged name is as its
//! member knows it ([`tether_server::Origins`]).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};
use tether_server::policy::Target;
use tether_server::{Origin, Origins};

use crate::config::{Naming, ServerConfig};

/// One member's lists as it answered them (`None`: it could not be reached).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Listed {
    pub tools: Vec<Value>,
    pub prompts: Vec<Value>,
    pub resources: Vec<Value>,
    pub templates: Vec<Value>,
}

/// Two members (or one rename) claim one name or URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Collision {
    pub what: &'static str,
    pub name: String,
    pub first: String,
    pub second: String,
}

impl std::fmt::Display for Collision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} `{}` is offered by both {} and {}; use names = \"prefix\" or \"priority\", or rename one in [servers.NAME.tools] rename",
            self.what, self.name, self.first, self.second
        )
    }
}

/// A merged name's owner: the member's index and its own name for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub member: usize,
    pub name: String,
}

/// A name's route and where its item sits in the merged list.
#[derive(Debug, Clone)]
struct Held {
    route: Route,
    at: usize,
}

/// The merged lists of one moment, and their routes.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub tools: Vec<Value>,
    pub prompts: Vec<Value>,
    pub resources: Vec<Value>,
    pub templates: Vec<Value>,
    /// The members' names (their endpoints), in order.
    members: Vec<String>,
    tool_routes: HashMap<String, Held>,
    prompt_routes: HashMap<String, Held>,
    uri_routes: HashMap<String, Held>,
    /// Who holds each name: the routes' members, and members down now that
    /// held a name before (it waits for them: never given to another).
    holders: HashMap<(Kind, String), usize>,
    /// The literal start of each template (up to its first `{`), longest first.
    template_routes: Vec<(String, usize)>,
    /// The members left out because they could not be listed, by index.
    pub down: Vec<usize>,
    /// Collisions met (`first` is the member that kept the name).
    pub collisions: Vec<Collision>,
}

impl Catalog {
    /// Merges `listed` (one entry per member of `config`, in its order);
    /// `before` is the catalog it replaces (none at first sight), whose
    /// members keep the names they held.
    pub fn merge(config: &ServerConfig, listed: &[Option<Arc<Listed>>], before: Option<&Catalog>) -> Self {
        let mut catalog = Catalog { members: config.upstreams.clone(), ..Catalog::default() };
        catalog.down = listed.iter().enumerate().filter(|(_, l)| l.is_none()).map(|(m, _)| m).collect();
        let names: Vec<&str> = config.upstreams.iter().map(String::as_str).collect();
        for (member, lists) in listed.iter().enumerate() {
            let Some(lists) = lists else { continue };
            for tool in &lists.tools {
                catalog.add_tool(config, &names, member, tool, before);
            }
            for prompt in &lists.prompts {
                catalog.add_named(config, &names, member, prompt, Kind::Prompt, before);
            }
            for resource in &lists.resources {
                catalog.add_resource(config, &names, member, resource, before);
            }
            for template in &lists.templates {
                let Some(uri) = template.get("uriTemplate").and_then(Value::as_str) else { continue };
                let literal = uri.split('{').next().unwrap_or_default().to_owned();
                catalog.template_routes.push((literal, member));
                catalog.templates.push(template.clone());
            }
        }
        catalog.template_routes.sort_by_key(|(literal, _)| std::cmp::Reverse(literal.len()));
        // The names of members down now wait for them.
        for (key, &holder) in before.map(|b| &b.holders).into_iter().flatten() {
            if catalog.down.contains(&holder) && !catalog.holders.contains_key(key) {
                catalog.holders.insert(key.clone(), holder);
            }
        }
        catalog
    }

    fn add_tool(&mut self, config: &ServerConfig, names: &[&str], member: usize, tool: &Value, before: Option<&Catalog>) {
        let Some(own) = tool.get("name").and_then(Value::as_str) else { return };
        let merged = merged_name(config, names[member], own);
        if !config.tools.allow.is_empty() && !config.tools.allow.iter().any(|p| glob_matches(p, &merged)) {
            return;
        }
        let shown = config.tools.rename.get(&merged).cloned().unwrap_or(merged);
        let mut tool = tool.clone();
        if let Some(object) = tool.as_object_mut() {
            object.insert("name".into(), Value::String(shown.clone()));
            mark_member(object, names[member]);
            if let Some(description) = config.tools.describe.get(&shown) {
                object.insert("description".into(), Value::String(description.clone()));
            }
        }
        self.claim(config, names, Kind::Tool, shown, Route { member, name: own.to_owned() }, tool, before);
    }

    fn add_named(
        &mut self,
        config: &ServerConfig,
        names: &[&str],
        member: usize,
        item: &Value,
        kind: Kind,
        before: Option<&Catalog>,
    ) {
        let Some(own) = item.get("name").and_then(Value::as_str) else { return };
        let shown = merged_name(config, names[member], own);
        let mut item = item.clone();
        if let Some(object) = item.as_object_mut() {
            object.insert("name".into(), Value::String(shown.clone()));
            mark_member(object, names[member]);
        }
        self.claim(config, names, kind, shown, Route { member, name: own.to_owned() }, item, before);
    }

    /// `route` claims `shown`. A name already claimed in this merge goes to
    /// the member that held it before, else stays with the first claimant.
    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        config: &ServerConfig,
        names: &[&str],
        kind: Kind,
        shown: String,
        route: Route,
        item: Value,
        before: Option<&Catalog>,
    ) {
        let key = (kind, shown);
        let held_before = before.and_then(|b| b.holders.get(&key)).copied();
        let collide = |kept: usize, other: usize| Collision {
            what: kind.what(),
            name: key.1.clone(),
            first: names[kept].to_owned(),
            second: names[other].to_owned(),
        };
        // Held by a member that is down now: it waits for that member.
        if let Some(holder) = held_before.filter(|h| *h != route.member && self.down.contains(h)) {
            self.collisions.push(collide(holder, route.member));
            return;
        }
        let (routes, list) = match kind {
            Kind::Tool => (&mut self.tool_routes, &mut self.tools),
            Kind::Prompt => (&mut self.prompt_routes, &mut self.prompts),
            Kind::Resource => (&mut self.uri_routes, &mut self.resources),
        };
        let Some(first) = routes.get(&key.1).cloned() else {
            let member = route.member;
            routes.insert(key.1.clone(), Held { route, at: list.len() });
            list.push(item);
            self.holders.insert(key, member);
            return;
        };
        // A member that newly offers a name another held keeps nothing; the
        // one that held it keeps it even where priority would say otherwise.
        let newcomer_keeps = first.route.member != route.member && held_before == Some(route.member);
        // At first sight, under priority the first member takes the name by design.
        if config.names != Naming::Priority || first.route.member == route.member || newcomer_keeps || kind == Kind::Resource {
            let collision = if newcomer_keeps {
                collide(route.member, first.route.member)
            } else {
                collide(first.route.member, route.member)
            };
            self.collisions.push(collision);
        }
        if newcomer_keeps {
            list[first.at] = item;
            self.holders.insert(key.clone(), route.member);
            routes.insert(key.1, Held { route, at: first.at });
        }
    }

    fn add_resource(&mut self, config: &ServerConfig, names: &[&str], member: usize, resource: &Value, before: Option<&Catalog>) {
        let Some(uri) = resource.get("uri").and_then(Value::as_str) else { return };
        let route = Route { member, name: uri.to_owned() };
        self.claim(config, names, Kind::Resource, uri.to_owned(), route, resource.clone(), before);
    }

    /// The member a name waits for while it is down (the name's route is gone).
    pub fn reserved_for(&self, what: &str, name: &str) -> Option<usize> {
        let kind = match what {
            "tool" => Kind::Tool,
            "prompt" => Kind::Prompt,
            _ => Kind::Resource,
        };
        self.holders.get(&(kind, name.to_owned())).copied().filter(|m| self.down.contains(m))
    }

    pub fn tool(&self, name: &str) -> Option<&Route> {
        self.tool_routes.get(name).map(|h| &h.route)
    }

    pub fn prompt(&self, name: &str) -> Option<&Route> {
        self.prompt_routes.get(name).map(|h| &h.route)
    }

    /// The member that serves `uri`: the one that lists it, else the one
    /// with the longest template whose literal start it has.
    pub fn resource(&self, uri: &str) -> Option<usize> {
        if let Some(held) = self.uri_routes.get(uri) {
            return Some(held.route.member);
        }
        self.template_routes.iter().find(|(literal, _)| uri.starts_with(literal.as_str())).map(|(_, member)| *member)
    }
}

/// Policies decide on a merged name as its member knows it.
impl Origins for Catalog {
    fn origin(&self, target: Target<'_>) -> Option<Origin> {
        let (member, name) = match target {
            Target::Tool(name) => self.tool(name).map(|r| (r.member, r.name.clone()))?,
            Target::Prompt(name) => self.prompt(name).map(|r| (r.member, r.name.clone()))?,
            Target::Resource(uri) => (self.resource(uri)?, uri.to_owned()),
        };
        Some(Origin { endpoint: self.members.get(member)?.clone(), name })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Tool,
    Prompt,
    Resource,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Prompt => "prompt",
            Kind::Resource => "resource",
        }
    }
}

/// Names the member in the item's `_meta` (`dev.tether/member`), for
/// people looking at the list (the console shows it).
fn mark_member(item: &mut Map<String, Value>, member: &str) {
    let meta = item.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(tether_wire::meta::MEMBER.into(), Value::String(member.to_owned()));
    }
}

fn merged_name(config: &ServerConfig, member: &str, own: &str) -> String {
    match config.names {
        Naming::Prefix => format!("{member}{}{own}", config.separator),
        Naming::Priority | Naming::None => own.to_owned(),
    }
}

fn glob_matches(pattern: &str, name: &str) -> bool {
    glob::Pattern::new(pattern).is_ok_and(|p| p.matches(name))
}

/// One page of a merged list: from `cursor` (an offset this server gave
/// out), `page_size` entries, and the cursor of the next page if any.
pub(crate) fn page(items: &[Value], cursor: Option<&str>, page_size: usize) -> Result<(Vec<Value>, Option<String>), String> {
    let start = match cursor {
        None => 0,
        Some(cursor) => {
            cursor.strip_prefix("at-").and_then(|n| n.parse::<usize>().ok()).filter(|n| *n <= items.len()).ok_or_else(|| {
                format!("cursor `{cursor}` was not given by this server (or the list changed); list again without one")
            })?
        }
    };
    let end = (start + page_size).min(items.len());
    let next = (end < items.len()).then(|| format!("at-{end}"));
    Ok((items[start..end].to_vec(), next))
}

/// A list result of `key` with one page and its `nextCursor`.
pub(crate) fn list_result(key: &str, page: Vec<Value>, next: Option<String>) -> Map<String, Value> {
    let mut result = Map::new();
    result.insert(key.into(), Value::Array(page));
    if let Some(next) = next {
        result.insert("nextCursor".into(), Value::String(next));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MemberDown, ToolRules};
    use serde_json::json;

    fn config(names: Naming, tools: ToolRules) -> ServerConfig {
        ServerConfig {
            name: "team".into(),
            upstreams: vec!["github".into(), "tickets".into()],
            names,
            separator: "__".into(),
            tools,
            on_member_down: MemberDown::Hide,
            page_size: 100,
            max_list_bytes: crate::config::DEFAULT_MAX_LIST_BYTES,
        }
    }

    fn tools(names: &[&str]) -> Option<Arc<Listed>> {
        let tools = names.iter().map(|n| json!({"name": n, "description": format!("{n} of its member")})).collect();
        Some(Arc::new(Listed { tools, ..Listed::default() }))
    }

    fn shown(catalog: &Catalog) -> Vec<&str> {
        catalog.tools.iter().filter_map(|t| t["name"].as_str()).collect()
    }

    #[test]
    fn prefix_names_every_tool_after_its_member_and_routes_it_back() {
        let catalog = Catalog::merge(
            &config(Naming::Prefix, ToolRules::default()),
            &[tools(&["create", "list"]), tools(&["create"])],
            None,
        );
        assert_eq!(shown(&catalog), ["github__create", "github__list", "tickets__create"]);
        assert_eq!(catalog.tool("tickets__create"), Some(&Route { member: 1, name: "create".into() }));
        assert_eq!(catalog.tools[2]["_meta"][tether_wire::meta::MEMBER], "tickets", "the member is named");
        assert!(catalog.collisions.is_empty());
    }

    #[test]
    fn priority_gives_a_name_to_the_member_listed_first_and_none_reports_the_collision() {
        let listed = [tools(&["create", "list"]), tools(&["create", "close"])];
        let catalog = Catalog::merge(&config(Naming::Priority, ToolRules::default()), &listed, None);
        assert_eq!(shown(&catalog), ["create", "list", "close"]);
        assert_eq!(catalog.tool("create").unwrap().member, 0);
        assert!(catalog.collisions.is_empty());

        let catalog = Catalog::merge(&config(Naming::None, ToolRules::default()), &listed, None);
        let collision = &catalog.collisions[0];
        assert_eq!(
            (collision.first.as_str(), collision.second.as_str(), collision.name.as_str()),
            ("github", "tickets", "create")
        );
        assert!(collision.to_string().contains("offered by both github and tickets"), "{collision}");
    }

    #[test]
    fn a_name_stays_with_the_member_that_holds_it_when_another_offers_it_later() {
        for naming in [Naming::Priority, Naming::None] {
            let config = config(naming, ToolRules::default());
            // tickets holds `close`; then github (listed first) starts offering it too.
            let first = Catalog::merge(&config, &[tools(&["create"]), tools(&["close"])], None);
            assert_eq!(first.tool("close").unwrap().member, 1);
            let later = Catalog::merge(&config, &[tools(&["create", "close"]), tools(&["close"])], Some(&first));
            assert_eq!(later.tool("close"), Some(&Route { member: 1, name: "close".into() }), "{naming:?}: never moved");
            assert_eq!(later.tools.iter().filter(|t| t["name"] == "close").count(), 1);
            assert_eq!(later.tools.iter().find(|t| t["name"] == "close").unwrap()["_meta"][tether_wire::meta::MEMBER], "tickets");
            let contest = &later.collisions[0];
            assert_eq!((contest.name.as_str(), contest.first.as_str(), contest.second.as_str()), ("close", "tickets", "github"));
            // Merged again from there: still the holder's.
            let again = Catalog::merge(&config, &[tools(&["create", "close"]), tools(&["close"])], Some(&later));
            assert_eq!(again.tool("close").unwrap().member, 1);
        }
        // At first sight, priority decides without a contest.
        let config = config(Naming::Priority, ToolRules::default());
        let fresh = Catalog::merge(&config, &[tools(&["close"]), tools(&["close"])], None);
        assert_eq!(fresh.tool("close").unwrap().member, 0);
        assert!(fresh.collisions.is_empty());
    }

    #[test]
    fn a_name_waits_for_its_holder_while_it_is_down() {
        let config = config(Naming::Priority, ToolRules::default());
        let first = Catalog::merge(&config, &[tools(&["create"]), tools(&["close"])], None);
        let down = Catalog::merge(&config, &[tools(&["create", "close"]), None], Some(&first));
        assert_eq!(down.tool("close"), None, "not given to github while tickets is down");
        assert_eq!(down.reserved_for("tool", "close"), Some(1));
        let back = Catalog::merge(&config, &[tools(&["create", "close"]), tools(&["close"])], Some(&down));
        assert_eq!(back.tool("close").unwrap().member, 1, "tickets has it again");
    }

    #[test]
    fn policies_learn_a_merged_name_as_its_member_knows_it() {
        let catalog = Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[tools(&["delete"]), tools(&["x"])], None);
        assert_eq!(
            catalog.origin(Target::Tool("github__delete")),
            Some(Origin { endpoint: "github".into(), name: "delete".into() })
        );
        assert_eq!(catalog.origin(Target::Tool("nobody__delete")), None);
    }

    #[test]
    fn allow_then_rename_then_describe() {
        let rules = ToolRules {
            allow: vec!["github__*".into(), "tickets__create".into()],
            rename: [("tickets__create".to_owned(), "open_ticket".to_owned())].into(),
            describe: [("open_ticket".to_owned(), "Open a ticket".to_owned())].into(),
        };
        let catalog = Catalog::merge(&config(Naming::Prefix, rules), &[tools(&["create"]), tools(&["create", "close"])], None);
        assert_eq!(shown(&catalog), ["github__create", "open_ticket"]);
        assert_eq!(catalog.tools[1]["description"], "Open a ticket");
        assert_eq!(catalog.tools[0]["description"], "create of its member");
        assert_eq!(catalog.tool("open_ticket"), Some(&Route { member: 1, name: "create".into() }));
        assert!(catalog.tool("tickets__close").is_none(), "not allowed");
    }

    #[test]
    fn a_rename_onto_another_name_is_a_collision() {
        let rules =
            ToolRules { rename: [("tickets__create".to_owned(), "github__create".to_owned())].into(), ..ToolRules::default() };
        let catalog = Catalog::merge(&config(Naming::Prefix, rules), &[tools(&["create"]), tools(&["create"])], None);
        assert_eq!(catalog.collisions.len(), 1);
    }

    #[test]
    fn resources_route_by_uri_and_by_template_and_a_down_member_is_left_out() {
        let a = Listed {
            resources: vec![json!({"uri": "file:///a", "name": "a"})],
            templates: vec![json!({"uriTemplate": "repo://{owner}/{name}", "name": "repo"})],
            ..Listed::default()
        };
        let b = Listed {
            resources: vec![json!({"uri": "file:///a", "name": "a again"}), json!({"uri": "mem://b", "name": "b"})],
            ..Listed::default()
        };
        let catalog =
            Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[Some(Arc::new(a)), Some(Arc::new(b))], None);
        assert_eq!(catalog.resource("file:///a"), Some(0));
        assert_eq!(catalog.resource("mem://b"), Some(1));
        assert_eq!(catalog.resource("repo://me/tether"), Some(0));
        assert_eq!(catalog.resource("other://x"), None);
        assert_eq!(catalog.collisions[0].what, "resource");

        let catalog = Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[None, tools(&["x"])], None);
        assert_eq!(catalog.down, [0]);
        assert_eq!(shown(&catalog), ["tickets__x"]);
    }

    #[test]
    fn pages_follow_their_cursor_to_the_end() {
        let items: Vec<Value> = (0..5).map(|n| json!(n)).collect();
        let (first, next) = page(&items, None, 2).unwrap();
        assert_eq!((first, next.as_deref()), (vec![json!(0), json!(1)], Some("at-2")));
        let (last, next) = page(&items, Some("at-4"), 2).unwrap();
        assert_eq!((last, next), (vec![json!(4)], None));
        assert!(page(&items, Some("at-9"), 2).is_err());
        assert!(page(&items, Some("bogus"), 2).is_err());
    }
}
