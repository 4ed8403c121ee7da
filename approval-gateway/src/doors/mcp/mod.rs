//! The MCP server an `mcp_client` agent is to the clients that connect to `/mcp/{agent}`
//! (rmcp's server side, Streamable HTTP): it lists the tools the agent's MCP servers listed,
//! as they described them, and turns each `tools/call` into a run of one call
//! (`countersign_model::mcp_proxy`), started as `POST /v1/runs` starts runs, with the caller's
//! key's principal as the requester. The worker runs it like any run, so the policy, held
//! calls, channels, deadlines, receipts, audit and the execution record all apply; the call is
//! answered with the run's outcome once it has one (`wait`). A client that follows tasks gets
//! a task as soon as a person must decide ([`tasks`]; 2025-11-25's form in [`tasks_2025`]);
//! one of 2026-07-28 that does not, the error that version has for it (the tasks extension is
//! required); one of an older version, past `[mcp] wait_secs`, an error result that says a
//! person must decide and that the same call again gets the outcome.
//!
//! The same call again is the same run: the run's idempotency key is made of the caller, the
//! MCP session (when the client's protocol version has sessions), the tool and the RFC 8785
//! digest of the arguments, so a repeat after the decision is answered from the run and
//! never runs the upstream tool a second time.
//!
//! A session answers only the principal that opened it ([`owners`]): a request naming
//! another's session is answered as one naming no session the gateway knows.

mod answer;
pub(crate) mod owners;
pub(super) mod route;
mod tasks;
mod tasks_2025;
mod wait;

use crate::auth::Caller;
use crate::runs::wait::{self as run_wait, Until, Waited};
use crate::runs::{self, Idempotency, NewRun, RunError};
use crate::state::AppState;
use countersign_model::agent::Agent;
use countersign_model::authority;
use countersign_model::digest::{canonical_json, sha256_hex};
use countersign_model::mcp_proxy::{self, ProxyCall};
use countersign_model::one_call;
use countersign_model::run::{Run, RunId};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    DetailedTask, ErrorData, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a session's watcher of the agent's tools looks whether the session ended.
const SESSION_CHECK: Duration = Duration::from_secs(30);

/// The MCP server of one `mcp_client` agent. The agent is read from the catalog at each
/// request, so a reload (a changed file, or a server whose tools changed) takes effect at once.
#[derive(Clone)]
struct Proxy {
    state: AppState,
    /// The agent's name.
    name: Arc<str>,
    /// The gateway's stop: a call waiting for its run is answered at once.
    stop: CancellationToken,
}

/// The Streamable HTTP service of `agent` (an `mcp_client` agent), with 2025-11-25's tasks in
/// front of it ([`tasks_2025`]); `stop` ends its sessions, streams and waits. Requests reach
/// it authenticated (`route`), with the [`Caller`] in their extensions.
pub(crate) fn service(
    state: &AppState,
    agent: Arc<Agent>,
    stop: CancellationToken,
) -> anyhow::Result<axum::Router> {
    listed(&agent).map_err(|e| anyhow::anyhow!("agent {:?}: {}", agent.def.name, e.message))?;
    let config = StreamableHttpServerConfig::default()
        // Every request must hold a countersign key, checked before rmcp sees it, and a page
        // a DNS rebinding attack runs has none; the Host check rmcp defaults to (loopback
        // names only) would refuse the gateway's own public name.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(state.config.max_body_bytes)
        .with_cancellation_token(stop.child_token());
    let proxy = Proxy {
        state: state.clone(),
        name: agent.def.name.as_str().into(),
        stop,
    };
    let layer = axum::middleware::from_fn_with_state(proxy.clone(), tasks_2025::intercept);
    let service: StreamableHttpService<Proxy, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(proxy.clone()), Default::default(), config);
    Ok(axum::Router::new().fallback_service(service).layer(layer))
}

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                format!("countersign/{}", self.name),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Calls of these tools go through countersign: a call its policy holds waits for \
                 a person's decision. A client with the tasks extension gets a task to follow; \
                 otherwise, if the answer says the call still waits, call the tool again with \
                 the same arguments later to get its outcome.",
            )
    }

    /// Tells the session's client when the agent's tools change (a reload, or one of its
    /// servers said so), until the gateway stops or the session ends (looked at every
    /// [`SESSION_CHECK`], so an ended session's watcher does not outlive it for long).
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let proxy = self.clone();
        let peer = context.peer;
        let mut reloads = self.state.reloads();
        tokio::spawn(async move {
            let listing = |proxy: &Proxy| proxy.agent().ok().and_then(|a| listed(&a).ok());
            let mut told = listing(&proxy);
            let mut check = tokio::time::interval(SESSION_CHECK);
            loop {
                tokio::select! {
                    _ = proxy.stop.cancelled() => return,
                    _ = check.tick() => {
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                    reloaded = reloads.changed() => if reloaded.is_err() { return },
                }
                let now = listing(&proxy);
                if now != told {
                    told = now;
                    if peer.notify_tool_list_changed().await.is_err() {
                        return;
                    }
                }
            }
        });
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(listed(&*self.agent()?)?))
    }

    #[tracing::instrument(skip_all, fields(agent = %self.name, tool = %request.name, run_id = tracing::field::Empty))]
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = caller(&context)?;
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let session = parts
            .and_then(|p| p.headers.get(owners::SESSION_HEADER))
            .and_then(|v| v.to_str().ok());
        let call = ProxyCall {
            tool: request.name.to_string(),
            arguments: Value::Object(request.arguments.unwrap_or_default()),
        };
        let agent = self.agent()?;
        if let Some(why) = misfit(&agent, &call)? {
            return Ok(answer::refused(&why).into());
        }
        let client = context
            .client_info()
            .map(|i| json!({"name": i.name, "version": i.version}));
        let run_id = self.start(&agent, caller, session, client, &call).await?;
        tracing::Span::current().record("run_id", run_id.as_str());
        let progress = context
            .meta
            .get_progress_token()
            .map(|token| (context.peer.clone(), token));
        // Waiting ends early when the client cancels its request or the gateway stops.
        let abandoned = async {
            tokio::select! {
                _ = context.ct.cancelled() => {}
                _ = self.stop.cancelled() => {}
            }
        };
        // A client that can follow a task is answered as soon as a person must decide. One of
        // a protocol version without sessions (2026-07-28 on) that cannot is told at once that
        // it needs the tasks extension, as that version has a server say; only clients of
        // older versions get the fallback that says to call again.
        let tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let sessionless = context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        let until = match tasks || sessionless {
            true => Until::OutcomeOrHeld,
            false => Until::Outcome,
        };
        let wait = Duration::from_secs(self.state.config.mcp.wait_secs);
        let waited = wait::outcome(&self.state, &run_id, (wait, until), progress, abandoned).await;
        let result: CallToolResult = match waited {
            Ok(Waited::Done(run)) => self.answer(&run, &call.tool).await,
            Ok(waited) if tasks => {
                return Ok(CallToolResponse::Task(tasks::created(
                    &run_id,
                    waited.run(),
                )));
            }
            Ok(_) if sessionless => {
                let required = ClientCapabilities::builder().enable_tasks().build();
                return Err(ErrorData::missing_required_client_capability(required));
            }
            Ok(waited) => answer::of(&run_id, &call.tool, waited, None),
            Err(e) if sessionless => return Err(internal(e)),
            Err(e) => answer::still_waiting(
                &run_id,
                &call.tool,
                &format!("its state could not be read ({e})"),
            ),
        };
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let caller = caller(&context)?;
        let run = self.task_run(caller, &request.task_id).await?;
        let opens_links = context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.url.is_some());
        let reviewer = opens_links.then_some(caller);
        Ok(GetTaskResult::new(self.task(&run, reviewer).await?))
    }

    /// The client's answers to the task's requests: the elicitation that sent its user to the
    /// inbox is answered (whatever the answer: the decision is made in the inbox, never by
    /// the client's word), so the task asks no more; other keys are none of the task's.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let run = self.task_run(caller(&context)?, &request.task_id).await?;
        for key in request.input_responses.keys() {
            if let Some(call_id) = tasks::reviewed_call(key) {
                self.state
                    .store
                    .mark_mcp_elicited(run.run_id.as_str(), call_id, tasks::ELICITED_TTL)
                    .await
                    .map_err(internal)?;
            }
        }
        Ok(())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.cancel(caller(&context)?, &request.task_id).await
    }
}

impl Proxy {
    /// The agent as the catalog has it now.
    fn agent(&self) -> Result<Arc<Agent>, ErrorData> {
        self.state.catalog().get(&self.name).ok_or_else(|| {
            ErrorData::internal_error(format!("agent {:?} is not loaded", self.name), None)
        })
    }

    /// The task of run `run`, as it stands.
    /// `reviewer`: the caller, if their client can send them to a page (URL elicitation), to
    /// be sent to the call's page in the inbox when they may decide it themself.
    async fn task(&self, run: &Run, reviewer: Option<&Caller>) -> Result<DetailedTask, ErrorData> {
        let result = match tasks::answered(run) {
            true => Some(self.answer(run, &proxied(run)?.tool).await),
            false => None,
        };
        // A run's keys expire only once it has ended: no need to ask Redis before.
        let retained = match run.status.is_terminal() {
            true => self
                .state
                .store
                .retained_for(&run.run_id)
                .await
                .map_err(internal)?,
            false => None,
        };
        let review = match reviewer {
            Some(caller) if result.is_none() => self.review(caller, run).await?,
            _ => None,
        };
        Ok(tasks::detailed(run, result, retained, review))
    }

    /// Where `caller` decides `run`'s held call themself: its page in the inbox (they sign
    /// in and decide there, under the same rule as everyone), if `caller` is a person who may
    /// decide it (`authority::actions_for`) and the gateway knows its public URL.
    async fn review(&self, caller: &Caller, run: &Run) -> Result<Option<tasks::Review>, ErrorData> {
        let base = self.state.config.public_base_url();
        let held = run.held_calls().next();
        let (Some(base), Some(held), true) = (base, held, run_wait::held(run)) else {
            return Ok(None);
        };
        let who = authority::Principal {
            id: &caller.principal,
            role: self.state.person_role(&caller.principal),
        };
        if authority::actions_for(who, held, authority::RunFacts::of(run)).is_empty() {
            return Ok(None);
        }
        let answered = self
            .state
            .store
            .mcp_elicited(run.run_id.as_str(), &held.call_id)
            .await
            .map_err(internal)?;
        Ok(Some(tasks::Review {
            call_id: held.call_id.clone(),
            url: format!("{base}/inbox/runs/{}/calls/{}", run.run_id, held.call_id),
            answered,
        }))
    }

    /// Cancels task `task_id` for `caller`, as `POST /v1/runs/{id}/cancel` cancels its run.
    #[tracing::instrument(skip_all, fields(agent = %self.name, run_id = %task_id))]
    async fn cancel(&self, caller: &Caller, task_id: &str) -> Result<(), ErrorData> {
        let run = self.task_run(caller, task_id).await?;
        if tasks::answered(&run) || run.status.is_terminal() {
            return Err(ErrorData::invalid_params(
                format!(
                    "task {:?} has ended: it cannot be cancelled",
                    run.run_id.as_str()
                ),
                None,
            ));
        }
        let by = caller
            .cancelling(run.run_id.as_str(), run.requested_by.as_deref())
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let reason = Some("the MCP client cancelled its task".to_string());
        match runs::cancel(&self.state, &run, (by, "mcp"), reason).await {
            Ok(()) => Ok(()),
            Err(RunError::Finished(why) | RunError::NoRun(why)) => {
                Err(ErrorData::invalid_params(why, None))
            }
            Err(e) => Err(internal(e)),
        }
    }

    /// What a `tools/call` of `tool` is answered once its run `run` has the call's outcome.
    async fn answer(&self, run: &Run, tool: &str) -> CallToolResult {
        let jti = self.receipt_jti(run, tool).await;
        answer::of(&run.run_id, tool, Waited::Done(run.clone()), jti.as_deref())
    }

    /// The run of task `task_id`, if `caller` may see it.
    async fn task_run(&self, caller: &Caller, task_id: &str) -> Result<Run, ErrorData> {
        let run = self.state.run(task_id).await.map_err(internal)?;
        tasks::visible(run, &self.name, caller, task_id)
    }

    /// The `jti` of the receipt the call of `tool` in `run` was sent with: the receipt of the
    /// decision that approved (or edited) it, which the upstream server received. None for a
    /// call that was sent without one, that did not reach the server (the worker kept no
    /// result of its), or whose decision cannot be read now (the answer then goes without it
    /// rather than not at all).
    async fn receipt_jti(&self, run: &Run, tool: &str) -> Option<String> {
        one_call::mcp_result(&run.messages)?;
        let decisions = match self.state.store.decisions(&run.run_id).await {
            Ok(decisions) => decisions,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the call's decision: answered without its receipt's jti");
                return None;
            }
        };
        let receipt = decisions
            .get(&mcp_proxy::call_id(tool))?
            .receipt
            .as_deref()?;
        self.state.receipts.jti(receipt)
    }

    /// Starts the call's run, or finds the run the same call started before.
    async fn start(
        &self,
        agent: &Agent,
        caller: &Caller,
        session: Option<&str>,
        client: Option<Value>,
        call: &ProxyCall,
    ) -> Result<RunId, ErrorData> {
        // What makes two calls the same call: who, in which session, which tool, with what.
        let same = json!({
            "agent": agent.def.name,
            "session": session,
            "tool": call.tool,
            "arguments": sha256_hex(canonical_json(&call.arguments)),
        });
        let same = canonical_json(&same);
        let idempotency = Idempotency {
            // Scoped to the caller, as POST /v1/runs scopes its keys.
            key_digest: sha256_hex(format!("{}\nmcp:{same}", caller.principal)),
            request_hash: sha256_hex(&same),
        };
        let new = NewRun {
            agent,
            input: call.request(),
            requested_by: caller.principal.clone(),
            metadata: json!({"mcp": {"session": session, "client": client, "call": call}}),
            idempotency: Some(idempotency),
        };
        let (run_id, _) = runs::start(&self.state, new)
            .await
            .map_err(|e| ErrorData::internal_error(format!("cannot start the run: {e}"), None))?;
        Ok(run_id)
    }
}

/// The authenticated caller of a request (`route` put it there).
fn caller(context: &RequestContext<RoleServer>) -> Result<&Caller, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .ok_or_else(|| ErrorData::internal_error("the request has no caller", None))
}

/// The call a proxy run keeps.
fn proxied(run: &Run) -> Result<ProxyCall, ErrorData> {
    ProxyCall::of_run(&run.metadata, &run.messages).map_err(internal)
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

/// The agent's tools as `tools/list` answers them: as its servers listed them, under the
/// names the agent gives them (a name two servers list has its server's prefix).
fn listed(agent: &Agent) -> Result<Vec<Tool>, ErrorData> {
    let found = agent
        .def
        .tools
        .iter()
        .filter_map(|t| Some((t, t.discovered.as_ref()?)));
    found
        .map(|(tool, found)| {
            let json = serde_json::to_value(found).map_err(internal)?;
            let mut listed: Tool = serde_json::from_value(json)
                .map_err(|e| internal(format!("tool {:?} cannot be listed: {e}", found.name)))?;
            listed.name = tool.name.clone().into();
            Ok(listed)
        })
        .collect()
}

/// Why `call` is refused before any run (its arguments do not fit the tool's input schema),
/// or an error for a tool `agent` does not have.
fn misfit(agent: &Agent, call: &ProxyCall) -> Result<Option<String>, ErrorData> {
    if agent.tool(&call.tool).is_none() {
        return Err(ErrorData::invalid_params(
            format!("no tool {:?}", call.tool),
            None,
        ));
    }
    let Err(problems) = agent.validate_input(&call.tool, &call.arguments) else {
        return Ok(None);
    };
    Ok(Some(format!(
        "The arguments do not fit the input schema of {}: {}. Nothing ran.",
        call.tool,
        problems.join("; ")
    )))
}
