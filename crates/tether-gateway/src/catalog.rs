//! [`Catalog`]: a virtual server's members' tools, prompts, resources and
//! resource templates merged into the lists one client sees, and the route
//! back from every merged name or URI to the member that owns it.
//!
//! The rules (see [`ServerConfig`]): names are made (`prefix`: the member's
//! name, the separator, its own name; `priority` and `none`: its own name),
//! then tools are kept by `allow`, renamed by `rename` and described by
//! `describe`. Two members may not offer one name: under `priority` the
//! member listed first keeps it; otherwise the collision is a
//! [`Collision`], which refuses a start and, at run time (a member's list
//! changed), is logged while the first member keeps the name. Resource URIs
//! are not renamed; a URI two members list is a collision the same way.
//! A member that could not be listed is left out ([`Catalog::down`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

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

/// The merged lists of one moment, and their routes.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub tools: Vec<Value>,
    pub prompts: Vec<Value>,
    pub resources: Vec<Value>,
    pub templates: Vec<Value>,
    tool_routes: HashMap<String, Route>,
    prompt_routes: HashMap<String, Route>,
    uri_routes: HashMap<String, usize>,
    /// The literal start of each template (up to its first `{`), longest first.
    template_routes: Vec<(String, usize)>,
    /// The members left out because they could not be listed, by index.
    pub down: Vec<usize>,
    /// Collisions met (the first member kept the name).
    pub collisions: Vec<Collision>,
}

impl Catalog {
    /// Merges `listed` (one entry per member of `config`, in its order).
    pub fn merge(config: &ServerConfig, listed: &[Option<Listed>]) -> Self {
        let mut catalog = Catalog::default();
        let names: Vec<&str> = config.upstreams.iter().map(String::as_str).collect();
        for (member, lists) in listed.iter().enumerate() {
            let Some(lists) = lists else {
                catalog.down.push(member);
                continue;
            };
            for tool in &lists.tools {
                catalog.add_tool(config, &names, member, tool);
            }
            for prompt in &lists.prompts {
                catalog.add_named(config, &names, member, prompt, Kind::Prompt);
            }
            for resource in &lists.resources {
                catalog.add_resource(&names, member, resource);
            }
            for template in &lists.templates {
                let Some(uri) = template.get("uriTemplate").and_then(Value::as_str) else { continue };
                let literal = uri.split('{').next().unwrap_or_default().to_owned();
                catalog.template_routes.push((literal, member));
                catalog.templates.push(template.clone());
            }
        }
        catalog.template_routes.sort_by_key(|(literal, _)| std::cmp::Reverse(literal.len()));
        catalog
    }

    fn add_tool(&mut self, config: &ServerConfig, names: &[&str], member: usize, tool: &Value) {
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
        self.claim(config, names, Kind::Tool, shown, Route { member, name: own.to_owned() }, tool);
    }

    fn add_named(&mut self, config: &ServerConfig, names: &[&str], member: usize, item: &Value, kind: Kind) {
        let Some(own) = item.get("name").and_then(Value::as_str) else { return };
        let shown = merged_name(config, names[member], own);
        let mut item = item.clone();
        if let Some(object) = item.as_object_mut() {
            object.insert("name".into(), Value::String(shown.clone()));
            mark_member(object, names[member]);
        }
        self.claim(config, names, kind, shown, Route { member, name: own.to_owned() }, item);
    }

    fn claim(&mut self, config: &ServerConfig, names: &[&str], kind: Kind, shown: String, route: Route, item: Value) {
        let (routes, list) = match kind {
            Kind::Tool => (&mut self.tool_routes, &mut self.tools),
            Kind::Prompt => (&mut self.prompt_routes, &mut self.prompts),
        };
        if let Some(first) = routes.get(&shown) {
            // Under priority the first member keeps the name by design.
            if config.names != Naming::Priority || first.member == route.member {
                self.collisions.push(Collision {
                    what: kind.what(),
                    name: shown,
                    first: names[first.member].to_owned(),
                    second: names[route.member].to_owned(),
                });
            }
            return;
        }
        routes.insert(shown, route);
        list.push(item);
    }

    fn add_resource(&mut self, names: &[&str], member: usize, resource: &Value) {
        let Some(uri) = resource.get("uri").and_then(Value::as_str) else { return };
        if let Some(&first) = self.uri_routes.get(uri) {
            self.collisions.push(Collision {
                what: "resource",
                name: uri.to_owned(),
                first: names[first].to_owned(),
                second: names[member].to_owned(),
            });
            return;
        }
        self.uri_routes.insert(uri.to_owned(), member);
        self.resources.push(resource.clone());
    }

    pub fn tool(&self, name: &str) -> Option<&Route> {
        self.tool_routes.get(name)
    }

    pub fn prompt(&self, name: &str) -> Option<&Route> {
        self.prompt_routes.get(name)
    }

    /// The member that serves `uri`: the one that lists it, else the one
    /// with the longest template whose literal start it has.
    pub fn resource(&self, uri: &str) -> Option<usize> {
        if let Some(&member) = self.uri_routes.get(uri) {
            return Some(member);
        }
        self.template_routes.iter().find(|(literal, _)| uri.starts_with(literal.as_str())).map(|(_, member)| *member)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Tool,
    Prompt,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Prompt => "prompt",
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
        }
    }

    fn tools(names: &[&str]) -> Option<Listed> {
        let tools = names.iter().map(|n| json!({"name": n, "description": format!("{n} of its member")})).collect();
        Some(Listed { tools, ..Listed::default() })
    }

    fn shown(catalog: &Catalog) -> Vec<&str> {
        catalog.tools.iter().filter_map(|t| t["name"].as_str()).collect()
    }

    #[test]
    fn prefix_names_every_tool_after_its_member_and_routes_it_back() {
        let catalog =
            Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[tools(&["create", "list"]), tools(&["create"])]);
        assert_eq!(shown(&catalog), ["github__create", "github__list", "tickets__create"]);
        assert_eq!(catalog.tool("tickets__create"), Some(&Route { member: 1, name: "create".into() }));
        assert_eq!(catalog.tools[2]["_meta"][tether_wire::meta::MEMBER], "tickets", "the member is named");
        assert!(catalog.collisions.is_empty());
    }

    #[test]
    fn priority_gives_a_name_to_the_member_listed_first_and_none_reports_the_collision() {
        let listed = [tools(&["create", "list"]), tools(&["create", "close"])];
        let catalog = Catalog::merge(&config(Naming::Priority, ToolRules::default()), &listed);
        assert_eq!(shown(&catalog), ["create", "list", "close"]);
        assert_eq!(catalog.tool("create").unwrap().member, 0);
        assert!(catalog.collisions.is_empty());

        let catalog = Catalog::merge(&config(Naming::None, ToolRules::default()), &listed);
        let collision = &catalog.collisions[0];
        assert_eq!(
            (collision.first.as_str(), collision.second.as_str(), collision.name.as_str()),
            ("github", "tickets", "create")
        );
        assert!(collision.to_string().contains("offered by both github and tickets"), "{collision}");
    }

    #[test]
    fn allow_then_rename_then_describe() {
        let rules = ToolRules {
            allow: vec!["github__*".into(), "tickets__create".into()],
            rename: [("tickets__create".to_owned(), "open_ticket".to_owned())].into(),
            describe: [("open_ticket".to_owned(), "Open a ticket".to_owned())].into(),
        };
        let catalog = Catalog::merge(&config(Naming::Prefix, rules), &[tools(&["create"]), tools(&["create", "close"])]);
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
        let catalog = Catalog::merge(&config(Naming::Prefix, rules), &[tools(&["create"]), tools(&["create"])]);
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
        let catalog = Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[Some(a), Some(b)]);
        assert_eq!(catalog.resource("file:///a"), Some(0));
        assert_eq!(catalog.resource("mem://b"), Some(1));
        assert_eq!(catalog.resource("repo://me/tether"), Some(0));
        assert_eq!(catalog.resource("other://x"), None);
        assert_eq!(catalog.collisions[0].what, "resource");

        let catalog = Catalog::merge(&config(Naming::Prefix, ToolRules::default()), &[None, tools(&["x"])]);
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
