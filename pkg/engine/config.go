package engine

import (
	"errors"
	"fmt"
	"time"
)

// Config sizes the cache and sets the scheduler's limits and speeds. The zero
// value of a field means its default (see Defaults).
type Config struct {
	// BlockSize is the number of tokens per KV block (vLLM --block-size).
	BlockSize int
	// NumGPUBlocks is the GPU KV capacity in blocks (--num-gpu-blocks).
	NumGPUBlocks int
	// NumCPUBlocks is the optional CPU offload tier in blocks; 0 disables it.
	NumCPUBlocks int
	// MaxModelLen bounds prompt plus output tokens of one request.
	MaxModelLen int
	// MaxNumSeqs bounds the running batch.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget; prefills are
	// chunked to fit it.
	MaxNumBatchedTokens int
	// PrefillTokensPerSec is the prefill speed for uncached prompt tokens.
	PrefillTokensPerSec float64
	// ReloadTokensPerSec is the speed of reloading CPU-tier blocks into the
	// GPU; 0 means ten times PrefillTokensPerSec.
	ReloadTokensPerSec float64
	// StepTime is the fixed cost of one scheduler step (a decode step of a
	// batch of one).
	StepTime time.Duration
	// StepTimePerSeq is added to a step for every sequence in its batch:
	// decode step time grows linearly with the batch.
	StepTimePerSeq time.Duration
	// Model is the served model name; LoRA adapters are named per request.
	Model string
	// SlidingWindow, when positive, makes the engine a hybrid-attention
	// model: besides the full-attention KV-cache group (group 0) it keeps
	// a sliding-window group (group 1) of this window in tokens, with the
	// same block size, in the same block pool (see the package doc).
	SlidingWindow int
}

// Defaults returns c with zero fields replaced by the defaults: block size
// 16, 2048 GPU blocks, max model len 4096, 256 sequences, 8192 batched
// tokens, 10000 prefill tokens/s, a 10 ms step growing 0.1 ms per sequence.
func (c Config) Defaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, 16)
	def(&c.NumGPUBlocks, 2048)
	def(&c.MaxModelLen, 4096)
	def(&c.MaxNumSeqs, 256)
	def(&c.MaxNumBatchedTokens, 8192)
	if c.PrefillTokensPerSec == 0 {
		c.PrefillTokensPerSec = 10000
	}
	if c.ReloadTokensPerSec == 0 {
		c.ReloadTokensPerSec = 10 * c.PrefillTokensPerSec
	}
	if c.StepTime == 0 {
		c.StepTime = 10 * time.Millisecond
	}
	if c.StepTimePerSeq == 0 {
		c.StepTimePerSeq = 100 * time.Microsecond
	}
	if c.Model == "" {
		c.Model = "sim-model"
	}
	return c
}

// ErrConfig classifies configuration errors.
var ErrConfig = errors.New("engine: invalid config")

// AtSpeed is c on hardware sp times as fast: prefill tokens per second
// multiplied by sp, decode step times divided by it (a newer or older GPU
// generation, or one that throttles, serving the same model; memory and
// limits stay).
func (c Config) AtSpeed(sp float64) Config {
	if sp == 1 {
		return c
	}
	c.PrefillTokensPerSec *= sp
	c.StepTime = time.Duration(float64(c.StepTime) / sp)
	c.StepTimePerSeq = time.Duration(float64(c.StepTimePerSeq) / sp)
	return c
}

// Validate reports the first invalid field of a defaulted config.
func (c Config) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.BlockSize <= 0:
		return bad("BlockSize", "must be positive, got %d", c.BlockSize)
	case c.NumGPUBlocks <= 0:
		return bad("NumGPUBlocks", "must be positive, got %d", c.NumGPUBlocks)
	case c.NumCPUBlocks < 0:
		return bad("NumCPUBlocks", "must not be negative, got %d", c.NumCPUBlocks)
	case c.MaxModelLen <= 1:
		return bad("MaxModelLen", "must be at least 2, got %d", c.MaxModelLen)
	case (c.MaxModelLen+c.BlockSize-1)/c.BlockSize > c.NumGPUBlocks:
		return bad("NumGPUBlocks", "%d blocks of %d tokens cannot hold one request of MaxModelLen %d",
			c.NumGPUBlocks, c.BlockSize, c.MaxModelLen)
	case c.MaxNumSeqs <= 0:
		return bad("MaxNumSeqs", "must be positive, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return bad("MaxNumBatchedTokens", "%d is below MaxNumSeqs %d", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.PrefillTokensPerSec <= 0:
		return bad("PrefillTokensPerSec", "must be positive")
	case c.ReloadTokensPerSec <= 0:
		return bad("ReloadTokensPerSec", "must be positive")
	case c.StepTime <= 0:
		return bad("StepTime", "must be positive")
	case c.StepTimePerSeq < 0:
		return bad("StepTimePerSeq", "must not be negative")
	case c.SlidingWindow < 0:
		return bad("SlidingWindow", "must not be negative, got %d", c.SlidingWindow)
	case c.SlidingWindow > 0 && c.NumCPUBlocks > 0:
		return bad("NumCPUBlocks", "a CPU tier is not modelled for a hybrid (sliding-window) engine")
	case c.SlidingWindow > 0 && (c.MaxModelLen+c.BlockSize-1)/c.BlockSize+(c.SlidingWindow+c.BlockSize-1)/c.BlockSize+1 > c.NumGPUBlocks:
		return bad("NumGPUBlocks", "%d blocks of %d tokens cannot hold one request of MaxModelLen %d and its sliding window of %d",
			c.NumGPUBlocks, c.BlockSize, c.MaxModelLen, c.SlidingWindow)
	}
	return nil
}
