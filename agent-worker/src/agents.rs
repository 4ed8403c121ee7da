//! Agents ready to run: each definition with its model client and compiled policies.

use countersign_llm::Model;
use countersign_model::agent::{Agent, Catalog};
use countersign_model::condition::Condition;
use countersign_model::policy::Policy;
use countersign_runtime::mcp::McpClients;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) struct RunnableAgent {
    pub agent: Arc<Agent>,
    pub model: Model,
    pub policies: HashMap<String, Policy>,
    /// The shadow policies of the tools that have one (`shadow` in their definition).
    pub shadows: HashMap<String, Policy>,
    /// The reviewer models of the tools that name one (`reviewer` in their definition).
    pub reviewers: HashMap<String, Reviewer>,
    /// The process's sessions with MCP servers, for the agent's MCP tools.
    pub mcp: McpClients,
}

/// A tool's reviewer model, with its envelope compiled once.
pub(crate) struct Reviewer {
    pub model: Model,
    pub envelope: Condition,
}

/// One version of every agent. A reload makes a new set; a drive keeps the set it started
/// with, so one step of a run sees one version of its agent.
#[derive(Default)]
pub(crate) struct Agents {
    by_name: BTreeMap<String, RunnableAgent>,
}

impl Agents {
    /// Compiles every agent of the catalog; a policy that does not compile stops the worker
    /// at start (or refuses a reload) rather than failing at the first call. The agents call MCP servers through `mcp`, the
    /// sessions their loading opened.
    pub(crate) fn compile(catalog: &Catalog, mcp: McpClients) -> anyhow::Result<Self> {
        let env = Arc::new(cel::Env::stdlib());
        let mut by_name = BTreeMap::new();
        for agent in catalog.iter() {
            let mut policies = HashMap::new();
            let mut shadows = HashMap::new();
            let mut reviewers = HashMap::new();
            for tool in &agent.def.tools {
                if let Some(def) = &tool.reviewer {
                    let reviewer = Reviewer {
                        model: Model::for_reviewer(def),
                        envelope: def.envelope()?,
                    };
                    reviewers.insert(tool.name.clone(), reviewer);
                }
                let live = Policy::compile(env.clone(), &tool.name, &tool.approval)?;
                policies.insert(tool.name.clone(), live);
                if let Some(shadow) = &tool.shadow {
                    let shadow = Policy::compile(env.clone(), &tool.name, shadow)?;
                    shadows.insert(tool.name.clone(), shadow);
                }
            }
            let runnable = RunnableAgent {
                model: Model::for_agent(agent)?,
                agent: agent.clone(),
                policies,
                shadows,
                reviewers,
                mcp: mcp.clone(),
            };
            by_name.insert(agent.def.name.clone(), runnable);
        }
        Ok(Self { by_name })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&RunnableAgent> {
        self.by_name.get(name)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &RunnableAgent> {
        self.by_name.values()
    }
}
