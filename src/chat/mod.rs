//! Conversation in, model text out and back: chat-template rendering (`template`) and the
//! parser that splits generated text into reasoning, answer and tool calls (`toolcall`).

mod arguments;
mod tags;
pub mod template;
pub mod toolcall;

pub use template::{ChatError, ChatTemplate, Message, RenderOptions, ToolCall};
pub use toolcall::{
    ParsedOutput, ParsedToolCall, StreamEvent, StreamParser, ToolSpec, parse_finished_output,
    parse_output, prompt_starts_in_reasoning,
};
