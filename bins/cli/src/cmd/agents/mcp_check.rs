//! `phrony agents validate --mcp`: connects to every MCP server the agent's bindings use (with
//! the auth secret read from its `fromEnv` variable), lists its tools (`tools/list`), and
//! reports, compiler-style at the binding's `file:line:column`:
//!
//! - an error for a bound tool the server does not list (`spec.tools[i].mcp.tool`, or
//!   `spec.tools[i].mcp` when the remote name is the wire name);
//! - a warning for a binding whose `input_schema` differs from the server's `inputSchema`
//!   (the runtime validates arguments against the binding's schema, so a stricter or looser
//!   server schema means calls that pass here may be refused there, or the reverse);
//! - an error at `spec.mcp_servers[j]` for a server that cannot be reached or listed, or
//!   whose secret variable is unset.

use std::path::Path;
use std::time::Duration;

use phrony_manifest::{CompiledAgent, Diagnostic, McpServer, Severity};
use phrony_mcp::{Client, Endpoint, RemoteTool};

/// How long one server may take to connect and list its tools.
const SERVER_TIMEOUT: Duration = Duration::from_secs(15);

/// The problems found on every server the bindings use (empty when all is well), and the
/// number of bindings checked.
pub(crate) fn check(
    agent: &CompiledAgent,
    manifest: &Path,
) -> anyhow::Result<(Vec<Diagnostic>, usize)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(check_all(agent, manifest)))
}

async fn check_all(agent: &CompiledAgent, manifest: &Path) -> (Vec<Diagnostic>, usize) {
    let mut diags = Vec::new();
    let mut checked = 0;
    for (j, server) in agent.spec.mcp_servers.iter().enumerate() {
        let bindings: Vec<(usize, &phrony_manifest::ToolBinding)> = agent
            .spec
            .tools
            .iter()
            .enumerate()
            .filter(|(_, t)| t.mcp.as_ref().is_some_and(|m| m.server == server.name))
            .collect();
        if bindings.is_empty() {
            continue;
        }
        let at = format!("spec.mcp_servers[{j}]");
        let tools = match list(agent, server).await {
            Ok(tools) => tools,
            Err((field, message)) => {
                diags.push(Diagnostic::at_field(
                    Severity::Error,
                    manifest,
                    &format!("{at}{field}"),
                    message,
                ));
                continue;
            }
        };
        for (i, binding) in bindings {
            checked += 1;
            let Some(mcp) = &binding.mcp else { continue };
            let wire = binding.wire_name();
            let remote = if mcp.tool.is_empty() {
                wire.as_str()
            } else {
                mcp.tool.as_str()
            };
            let Some(found) = tools.iter().find(|t| t.name == remote) else {
                let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                names.sort_unstable();
                let field = if mcp.tool.is_empty() {
                    "mcp"
                } else {
                    "mcp.tool"
                };
                diags.push(Diagnostic::at_field(
                    Severity::Error,
                    manifest,
                    &format!("spec.tools[{i}].{field}"),
                    format!(
                        "MCP server `{}` has no tool `{remote}` (it lists: {})",
                        server.name,
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    ),
                ));
                continue;
            };
            let ours = binding
                .input_schema
                .as_ref()
                .and_then(|s| s.inline.as_ref())
                .map(|j| &j.0);
            if ours != Some(&found.input_schema) {
                diags.push(Diagnostic::at_field(
                    Severity::Warning,
                    manifest,
                    &format!("spec.tools[{i}].input_schema"),
                    format!(
                        "differs from the inputSchema MCP server `{}` lists for `{remote}`: {}",
                        server.name, found.input_schema
                    ),
                ));
            }
        }
    }
    (diags, checked)
}

/// The server's tools; on failure the field (under `spec.mcp_servers[j]`) and the message.
async fn list(
    agent: &CompiledAgent,
    server: &McpServer,
) -> Result<Vec<RemoteTool>, (String, String)> {
    let mut endpoint =
        Endpoint::new(&server.url).map_err(|e| (".url".to_owned(), e.to_string()))?;
    if let Some(auth) = &server.auth {
        let requirement = agent
            .secret_requirements()
            .into_iter()
            .find(|s| s.name == auth.secret);
        let value = requirement
            .as_ref()
            .and_then(|r| std::env::var(&r.from_env).ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                let var = requirement.map_or_else(|| "its variable".to_owned(), |r| r.from_env);
                (
                    ".auth.secret".to_owned(),
                    format!("set {var} (secret `{}`) to check this server", auth.secret),
                )
            })?;
        endpoint = match auth.scheme.as_str() {
            "bearer" => endpoint.bearer(&value),
            _ => endpoint.header(&auth.header, &value),
        }
        .map_err(|e| (".auth".to_owned(), e.to_string()))?;
    }
    let listed = tokio::time::timeout(SERVER_TIMEOUT, async {
        let client = Client::connect(endpoint).await?;
        client.list_tools().await
    })
    .await;
    match listed {
        Ok(Ok(tools)) => Ok(tools),
        Ok(Err(e)) => Err((
            ".url".to_owned(),
            format!("cannot list the server's tools: {e}"),
        )),
        Err(_) => Err((
            ".url".to_owned(),
            format!("cannot list the server's tools: no answer within {SERVER_TIMEOUT:?}"),
        )),
    }
}
