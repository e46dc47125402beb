// Package enginehttp is the HTTP client kvroute reaches its engines with
// when they ask for an API key: vLLM started with --api-key (or
// VLLM_API_KEY) refuses every /v1 request without "Authorization: Bearer
// <key>" (401), the model list (/v1/models, where the router learns LoRA
// adapters) and the render endpoints (/v1/*/render) among them; SGLang's
// --api-key guards its endpoints the same way.
//
// Config names the file holding the key (a Kubernetes Secret mounted as a
// file). Client returns an *http.Client whose every request carries the
// key as a bearer token. The file is re-read when its size or
// modification time changed since the last read, checked at most once per
// Config.ReloadInterval, on a request (no goroutine, nothing to stop): a
// rotated Secret takes effect without a restart. A re-read that fails, or
// finds the file empty, keeps the previous key and reports the error
// through OnError; the first read happens in Client, whose error is the
// configuration's.
package enginehttp
