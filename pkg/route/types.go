package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
)

// Errors a decision may end with; callers map them to the wire with errors.Is.
var (
	// ErrNoReplica: no healthy, eligible replica serves the request's model.
	ErrNoReplica = errors.New("route: no healthy replica")
	// ErrUnknownModel: no replica in the set serves the requested model.
	ErrUnknownModel = errors.New("route: unknown model")
	// ErrPinUnhealthy (an ErrNoReplica): the request is pinned
	// (Request.Pin) and the replica at its pin is not healthy.
	ErrPinUnhealthy = fmt.Errorf("%w: the pinned replica is not healthy", ErrNoReplica)
)

// Replica is one routable replica (or data-parallel rank) as the replica set
// describes it.
type Replica struct {
	ID      index.ReplicaID
	Address string // ip:port that Envoy connects to
	Model   string
	// BlockSize is the engine's KV block size in tokens (the router hashes
	// requests for this replica's model with it).
	BlockSize int
	// Adapters are the LoRA adapters the replica serves on top of Model
	// (vLLM --lora-modules): a request naming one of them is routed only
	// among the replicas listing it, keyed under the adapter's root.
	Adapters []string
	// Lookahead is how many tokens after each block the engine folds into
	// the block's hash (vLLM speculative decoding with prefix caching; the
	// events report it): the request's keys for this replica are computed
	// with kvblock.Options.WithLookahead. 0: none.
	Lookahead int
}

// Request is the protocol-free view of one inference request.
type Request struct {
	Model string
	// LoRA is the adapter name when the request's model names a LoRA
	// adapter. Decide sets it itself when Model is an adapter some replica
	// lists in Replica.Adapters.
	LoRA      string
	CacheSalt string
	// Tokens are the prompt's token ids when already known (a pre-tokenized
	// prompt); otherwise Input is given to the tokenizer.
	Tokens []uint32
	Input  TokenizeInput
	// SessionKey is the session affinity key (x-session-id header).
	// Without it the router derives one (see SessionKey).
	SessionKey string
	// BodySession is the conversation the body names, if any: its
	// session_id, conversation_id, conversation or metadata's session or
	// conversation id (openai.Request.SessionID). After the header, the
	// strongest source of SessionKey.
	BodySession string
	// CacheKey is OpenAI's prompt_cache_key, if any: a key the client
	// chose for requests that share a prefix, one conversation's or many
	// (a tenant's). A first turn's key, like User (see SessionKey).
	CacheKey string
	// User is the OpenAI `user` field, if any: the last resort of
	// SessionKey.
	User string
	// MaxTokens is the request's output limit, 0 when absent.
	MaxTokens int
	// Streams reports that the response streams its tokens (OpenAI
	// stream: true), so that its first token is seen when the engine
	// generates it: such a request, while it waits for one, bounds its
	// replica's prefill speed (load.Output.Streams).
	Streams bool
	// Subset, when not nil, restricts the pick to these addresses (the
	// ext_proc subset hint). An empty non-nil subset admits nothing.
	Subset []string
	// Pin, when set, is the one address that can serve the request: the
	// replica whose engine stores the response it continues, retrieves or
	// cancels (an engine's Responses API store is its own process's
	// memory). Among the candidates the model and Subset admit, only the
	// replicas at Pin are kept, healthy or not: elsewhere the request is
	// a 404. When none is at Pin (the replica left the set) the pin is
	// dropped and the request routed as any other (Decision.Pin is "").
	Pin string
}

// TokenizeInput is what a tokenizer needs to reproduce the engine's tokens.
type TokenizeInput struct {
	// Prompt is a completion prompt (string form).
	Prompt string
	// Messages is a chat request's messages array (raw JSON), with Tools and
	// ChatTemplateKwargs passed through as the engine would receive them.
	Messages            json.RawMessage
	Tools               json.RawMessage
	ChatTemplateKwargs  json.RawMessage
	AddGenerationPrompt bool
	// Documents is a chat request's documents (raw JSON array), which the
	// engine hands its template.
	Documents json.RawMessage
	// ContinueFinalMessage: the prompt ends inside the final message, which
	// the model continues (vLLM's continue_final_message).
	ContinueFinalMessage bool
	// ChatMessages, when set, are Messages as the request parser decoded
	// them; a local tokenizer renders them instead of decoding Messages.
	ChatMessages []ChatMessage
	// SystemFirst is, for an Anthropic Messages request with inline system
	// messages, Messages with those merged into the leading system message,
	// which the engine renders instead when its chat template rejects a
	// system message after the first (nil: the same as Messages).
	SystemFirst json.RawMessage
	// ToolChoice is the request's tool_choice (raw JSON, nil for none),
	// which SGLang's rendering depends on, and vLLM's with
	// --exclude-tools-when-tool-choice-none.
	ToolChoice json.RawMessage
	// ReasoningEffort is the request's reasoning effort ("" for none),
	// which the engine merges into the template arguments
	// (ChatTemplateKwargs are the request's own).
	ReasoningEffort string
	// ThinkingDisabled: an Anthropic Messages request with thinking
	// disabled, whose reasoning effort the engine resolves for its template
	// (ReasoningEffort is then "").
	ThinkingDisabled bool
	// AddSpecialTokens mirrors the engine's add_special_tokens.
	AddSpecialTokens bool
	// Chat reports whether this is a chat request (Messages set).
	Chat bool
	// Body is the request's JSON body as the client sent it, and API the
	// path of the OpenAI-compatible API it was sent to (e.g.
	// /v1/chat/completions): what an engine's render endpoint (API +
	// "/render") takes. Set for every parsed request, including Responses
	// and Messages bodies the router cannot convert (the fields above are
	// then empty).
	Body json.RawMessage
	API  string
}

// ChatMessage is one decoded chat message (the fields of openai.Message):
// Content is the text the template renders, NonText reports other content
// parts, Raw is the message object's JSON.
type ChatMessage struct {
	Role    string
	Content string
	NonText bool
	Name    string
	Raw     json.RawMessage
}

// Tokens is a tokenizer's answer.
type Tokens struct {
	// IDs may be shared with the tokenizer's caches: read them or append
	// to them, never write them in place.
	IDs []uint32
	// Source names who produced them ("passthrough", "remote", "local",
	// "approximate").
	Source string
	// Exact is false for approximate tokens: they must never be matched
	// against keys learned from engine events.
	Exact bool
}

// Tokenizer turns a request's input into the engine's token ids.
type Tokenizer interface {
	Tokenize(ctx context.Context, model string, in TokenizeInput) (Tokens, error)
}

// Matcher answers longest-prefix matches (index.Index implements it). It
// reads keys and never writes them: the router matches the keys it keeps
// for the rest of the decision.
type Matcher interface {
	Match(keys []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch
}

// State tells the router about replicas: the current set, each one's load,
// and how far its index view is to be trusted.
type State interface {
	Replicas() []Replica
	Load(id index.ReplicaID) load.Load
	// Trust is in [0, 1]: 0 while the replica is resyncing (its view is
	// known to be incomplete), below 1 when its served hits fall short of
	// predicted ones. It scales the cache credit the policy gives the
	// replica's matches (policy.Candidate.Trust).
	Trust(id index.ReplicaID) float64
}

// EventFeeds is an optional interface of a State: whether a replica's cache
// view comes from an engine event stream. Only replicas that are not
// event-fed take part in the approximate mode (Options.Approx); a State
// without this method has every replica event-fed.
type EventFeeds interface {
	EventFed(id index.ReplicaID) bool
}

// ViewGaps is an optional interface of a State: whether a replica's
// event-fed view is known to miss blocks the replica holds. The events
// manager reports it for index.GapHold after a store whose parent the index
// did not hold (a batch lost without replay; stores resumed after the view
// was cleared): the chain of that store is missing below it. A State
// without this method reports no gaps.
//
// At such a replica, the longest earlier prompt the router sent there
// that the new prompt resends is credited where the index shows less of it
// (Candidate.Vouched): the engine computed those blocks, and the view that
// would say whether it still holds them is the one known to have lost
// stores. The closed-loop trust (Trust) still scales the credit, and the
// vouched blocks are part of the prediction it checks, so a replica whose
// vouched blocks turn out evicted loses credit as for any over-prediction.
// A view being relearned (Trust 0) gets the approximate mode's trust
// instead, its own matches still counting for nothing: the vouched prompt,
// or the pending credit of one in flight, is what counts there.
type ViewGaps interface {
	ViewGaps(id index.ReplicaID) bool
}

// Candidate is one replica's part in a decision.
type Candidate struct {
	Replica  index.ReplicaID
	Address  string
	Matched  [index.NumTiers]int
	Trust    float64
	Load     load.Load
	Cost     float64 // the policy's score; NaN when it has none
	Eligible bool    // healthy, in the subset, serving the model
	// Home marks the replica that served the session's previous request.
	Home bool
	// Pending counts the request's blocks beyond Matched in flight to the
	// replica (Options.Pending), on the GPU tier, in the replica's blocks.
	Pending int
	// Approximate is set when Matched and Trust come from the
	// dispatch-learned index (Options.Approx), not from engine events.
	Approximate bool
	// Vouched counts the blocks, in the router's primary block size,
	// credited on the GPU tier beyond Matched because the replica's view
	// is known to miss stores and the router sent it this prompt's
	// longest earlier prompt (see ViewGaps): the policy saw Matched plus
	// Vouched there, or, for a view being relearned (trust 0), Vouched
	// alone at the Trust reported (Options.ApproxTrust).
	Vouched int
}

// Decision is the outcome of Decide: the pick and everything needed to
// explain it.
type Decision struct {
	Replica   index.ReplicaID
	Address   string
	Fallbacks []string // next-best addresses, for Envoy retries
	Policy    string
	Reason    string
	// Degraded says why cache affinity was not used ("tokenize_error",
	// "tokenize_timeout", "approximate_tokens", "cold_index", ...), if so;
	// "approximate_index" when approximate tokens were matched against the
	// dispatch-learned index.
	Degraded     string
	PromptTokens int
	PromptBlocks int
	// MaxTokens is the request's max_tokens, 0 when absent: a finished
	// response's output is learned against it (RateSample.MaxTokens).
	MaxTokens int
	// ExpectedOutputTokens is the output the router expected the request
	// to generate (Rates.ExpectOutput of MaxTokens; 0 when unknown), as
	// the policy was given it in blocks.
	ExpectedOutputTokens int
	TokenSource          string
	TokenizeTime         time.Duration
	DecideTime           time.Duration
	Candidates           []Candidate
	// Session is the session key the decision used (SessionKey: the
	// header, else one derived from the request), "" for none.
	Session string
	// SessionFromPrompt is set when Session was not the request's own
	// (SessionKey gave none) but the conversation its prompt continues
	// (the router's record of the prompts it sent).
	SessionFromPrompt bool
	// Pin is Request.Pin when the pick was held to it, "" when the
	// request had no pin or its replica had left the set.
	Pin string
	// QueuedTokens are the uncached prompt tokens the router estimates were
	// still queued for prefill ahead of the request on its replica when it
	// was sent: the replica's fluid queue (policy.Candidate.Queued) capped
	// by its charged backlog (Load.ActivePrefillBlocks), in tokens; 0 for
	// Explain. It is the rate learner's RateSample.Queued.
	QueuedTokens int
	// PrefillBlocks is the prefill the pick is charged: its prompt blocks
	// less those matched there and, for a sibling holding its whole
	// prompt there (policy.HoldsPrompt), less the part in flight that it
	// finds computed (policy.InFlightCredit: the engine computes a shared
	// prefix once, for the request that carried it). It is what the
	// in-flight tracker charges the pick's prefill.
	PrefillBlocks int
	// Hold is the pick's in-flight charge when the Router has a Tracker
	// (Options.Tracker): the caller must finish it (FirstToken at the
	// first token, Done on every path). Nil otherwise, and for Explain.
	Hold *load.Handle

	// records are the pick's index records Options.DeferRecords leaves to
	// the caller (Decision.Commit); nil otherwise.
	records *records
}

// records are a decision's index records not yet written.
type records struct {
	approx        *ApproxIndex
	approxKeys    []kvblock.Key
	approxReplica index.ReplicaID
	at            time.Time
	pending       *ApproxIndex
	staged        *Staged
}

// Detached returns the decision as an explanation only: without its
// in-flight charge (Hold) and deferred index records, so that keeping it
// (a history of recent decisions) holds nothing the request still owns.
func (d Decision) Detached() Decision {
	d.Hold, d.records = nil, nil
	return d
}

// Commit writes the decision's index records when the Router left them to
// the caller (Options.DeferRecords): the dispatch-learned index's record
// of the pick and the pending record, which every decision has matched
// since Decide staged it. Call it once the pick is answered, and on every
// path (a later call, or one on a decision without deferred records, does
// nothing). Not safe for concurrent use on one decision.
func (d *Decision) Commit() {
	if r := d.records; r != nil {
		d.records = nil
		r.commit()
	}
}

func (r *records) commit() {
	if r.approxKeys != nil {
		r.approx.Record(r.approxKeys, r.approxReplica, r.at)
	}
	if r.staged != nil {
		r.pending.Commit(r.staged)
	}
}

// MatchedBlocks returns the picked replica's matched blocks over all tiers.
func (d Decision) MatchedBlocks() int {
	c := d.Picked()
	return c.Matched[0] + c.Matched[1] + c.Matched[2]
}

// VouchedBlocks returns the blocks credited at the chosen replica beyond
// its match because its view is known to miss stores (Candidate.Vouched).
func (d Decision) VouchedBlocks() int { return d.Picked().Vouched }

// Picked returns the chosen replica's candidate, with the load it was
// picked at (zero when there is none).
func (d Decision) Picked() Candidate {
	for _, c := range d.Candidates {
		if c.Replica == d.Replica {
			return c
		}
	}
	return Candidate{}
}
