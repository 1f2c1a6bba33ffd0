//! `stub-script.json`: the scripted model of the dev-only `stub` provider (§1.7).

use serde_json::Value;

/// File name of the script, beside the agent YAML.
pub const STUB_SCRIPT_FILE: &str = "stub-script.json";

/// A parsed stub script. `turns[k]` is the event list of the k-th model completion of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct StubScript {
    /// One entry per model completion; never empty, and no entry is empty.
    pub turns: Vec<Vec<StubEvent>>,
}

/// One scripted model event.
#[derive(Debug, Clone, PartialEq)]
pub enum StubEvent {
    /// Streamed assistant text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A tool call by wire name.
    ToolCall {
        /// Wire name of the tool.
        name: String,
        /// Arguments (an object; `{}` when absent).
        args: Value,
    },
    /// End of the completion.
    Completed {
        /// Normalized stop reason: `stop`→`end_turn`, `tool_calls`→`tool_use`,
        /// `length`→`max_tokens`; default `end_turn`.
        stop_reason: String,
    },
    /// A failed completion.
    Failed {
        /// The error text (default `stub failed`).
        error: String,
    },
}

/// Why a stub script is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StubScriptError {
    /// The file is empty.
    #[error("stub-script.json is empty")]
    Empty,
    /// Not JSON, or not the script shape.
    #[error("stub-script.json: invalid JSON: {0}")]
    Json(String),
    /// `turns` is missing or empty.
    #[error("stub script has no turns")]
    NoTurns,
    /// One turn is not a list.
    #[error("stub script turn {turn}: a turn must be a list of events")]
    TurnNotAList {
        /// 1-based turn number.
        turn: usize,
    },
    /// One turn has no events.
    #[error("stub script turn {turn}: a turn needs at least one event")]
    EmptyTurn {
        /// 1-based turn number.
        turn: usize,
    },
    /// One event is invalid.
    #[error("stub script turn {turn}: event {event}: {message}")]
    Event {
        /// 1-based turn number.
        turn: usize,
        /// 1-based event number within the turn.
        event: usize,
        /// What is wrong.
        message: String,
    },
}

fn str_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

fn normalize_stop_reason(s: &str) -> String {
    match s {
        "" | "stop" => "end_turn",
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        other => other,
    }
    .to_owned()
}

fn parse_event(v: &Value) -> Result<StubEvent, String> {
    let Value::Object(obj) = v else {
        return Err("an event must be an object".to_owned());
    };
    let kind = str_field(obj, "type")?.unwrap_or_default();
    Ok(match kind {
        "text_delta" => StubEvent::TextDelta {
            text: str_field(obj, "text")?.unwrap_or_default().to_owned(),
        },
        "tool_call" => {
            let name = str_field(obj, "name")?.unwrap_or_default();
            if name.trim().is_empty() {
                return Err("tool_call needs a name (the tool's wire name)".to_owned());
            }
            let args = match obj.get("args") {
                None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => return Err("tool_call args must be an object".to_owned()),
            };
            StubEvent::ToolCall {
                name: name.to_owned(),
                args,
            }
        }
        "completed" => StubEvent::Completed {
            stop_reason: normalize_stop_reason(str_field(obj, "stop_reason")?.unwrap_or_default()),
        },
        "failed" => StubEvent::Failed {
            error: str_field(obj, "error")?
                .filter(|e| !e.is_empty())
                .unwrap_or("stub failed")
                .to_owned(),
        },
        "" => {
            return Err("type is required (text_delta, tool_call, completed or failed)".to_owned());
        }
        other => {
            return Err(format!(
                "unknown event type {other:?}; expected text_delta, tool_call, completed or failed"
            ));
        }
    })
}

impl StubScript {
    /// Parses and checks the text of a `stub-script.json`.
    pub fn parse(text: &str) -> Result<Self, StubScriptError> {
        if text.trim().is_empty() {
            return Err(StubScriptError::Empty);
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| StubScriptError::Json(e.to_string()))?;
        let turns = match value.get("turns") {
            Some(Value::Array(t)) if !t.is_empty() => t,
            Some(Value::Array(_)) | None | Some(Value::Null) => {
                return Err(StubScriptError::NoTurns);
            }
            Some(_) => {
                return Err(StubScriptError::Json(
                    "turns must be a list of event lists".to_owned(),
                ));
            }
        };
        let mut out = Vec::with_capacity(turns.len());
        for (t, turn) in turns.iter().enumerate() {
            let Value::Array(events) = turn else {
                return Err(StubScriptError::TurnNotAList { turn: t + 1 });
            };
            if events.is_empty() {
                return Err(StubScriptError::EmptyTurn { turn: t + 1 });
            }
            let mut parsed = Vec::with_capacity(events.len());
            for (e, ev) in events.iter().enumerate() {
                parsed.push(parse_event(ev).map_err(|message| StubScriptError::Event {
                    turn: t + 1,
                    event: e + 1,
                    message,
                })?);
            }
            out.push(parsed);
        }
        Ok(Self { turns: out })
    }

    /// Wire names called by the script, in order of first appearance.
    pub fn tool_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for ev in self.turns.iter().flatten() {
            if let StubEvent::ToolCall { name, .. } = ev
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }
}
