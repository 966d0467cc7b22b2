"""The OpenAI wire formats: chat-completion objects and chunks, the Responses API items,
the generation parameters and the chat-completions request body."""
