// Package parsedchat hands the request parser's decoded chat messages
// (openai.Message) to the tokenizer (route.ChatMessage), so that a local
// tokenizer renders the chat template without decoding the messages JSON a
// second time. It is its own package because pkg/openai's tests use
// pkg/tokenize, which therefore cannot import pkg/openai.
package parsedchat
