package policy

import (
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/pkg/index"
	"math"
)

// Policy names, as accepted by New and written in configuration.
const (
	NameBlended        = "blended"
	NameHardSwitch     = "hardswitch"
	NamePrefixAffinity = "prefixaffinity"
	NameSession        = "session"
	NameLeastLoad      = "leastload"
	NameRoundRobin     = "roundrobin"
	NameRandom         = "random"
	NamePureAffinity   = "pureaffinity"
	NameWeighted       = "weighted"
	NameKVRoute        = "kvroute"
)

// Names lists every policy New accepts.
func Names() []string {
	return []string{NameBlended, NameHardSwitch, NamePrefixAffinity, NameSession,
		NameLeastLoad, NameRoundRobin, NameRandom, NamePureAffinity, NameWeighted, NameKVRoute}
}

// ErrConfig classifies configuration errors (an unknown policy name, an out
// of range knob); the message names the offending field.
var ErrConfig = errors.New("policy: invalid config")

// Config holds every policy's knobs, one section per policy. A nil pointer
// (an absent YAML key) means the default; the zero Config is the defaults.
type Config struct {
	Blended        BlendedConfig        `yaml:"blended"`
	HardSwitch     HardSwitchConfig     `yaml:"hardswitch"`
	PrefixAffinity PrefixAffinityConfig `yaml:"prefixaffinity"`
	Session        SessionConfig        `yaml:"session"`
	Weighted       WeightedConfig       `yaml:"weighted"`
	KVRoute        KVRouteConfig        `yaml:"kvroute"`
}

// BlendedConfig are NVIDIA Dynamo's router knobs, with Dynamo's names and
// defaults.
type BlendedConfig struct {
	// OverlapScoreCredit scales cache credit (default 1; 0 deletes cache
	// awareness: Dynamo's load-aware preset).
	OverlapScoreCredit *float64 `yaml:"overlap_score_credit"`
	// OverlapScoreCreditDecay shrinks device (GPU) credit by
	// 1/(1+decay*excess), excess being the candidate's active prefill above
	// the least-loaded candidate's in request-equivalents (default 0).
	OverlapScoreCreditDecay float64 `yaml:"overlap_score_credit_decay"`
	// PrefillLoadScale weighs the adjusted prefill term (default 1).
	PrefillLoadScale *float64 `yaml:"prefill_load_scale"`
	// DecodeActiveRequestWeight charges blocks per active request (default 0).
	DecodeActiveRequestWeight float64 `yaml:"decode_active_request_weight"`
	// HostCacheHitWeight credits a CPU-tier block (default 0.75).
	HostCacheHitWeight *float64 `yaml:"host_cache_hit_weight"`
	// DiskCacheHitWeight credits a disk-tier block (default 0.25).
	DiskCacheHitWeight *float64 `yaml:"disk_cache_hit_weight"`
}

// HardSwitchConfig are SGLang's cache_aware knobs with its defaults.
type HardSwitchConfig struct {
	// CacheThreshold is the match rate at or above which the best match
	// wins (default 0.3).
	CacheThreshold *float64 `yaml:"cache_threshold"`
	// BalanceAbsThreshold: imbalanced needs max-min load above it (default 64).
	BalanceAbsThreshold *float64 `yaml:"balance_abs_threshold"`
	// BalanceRelThreshold: imbalanced also needs max > rel*min (default 1.5).
	BalanceRelThreshold *float64 `yaml:"balance_rel_threshold"`
}

// PrefixAffinityConfig are Ray Serve's PrefixCacheAffinityRouter knobs.
type PrefixAffinityConfig struct {
	// ImbalancedThreshold: max-min queue length above it switches to power
	// of two choices (default +Inf, i.e. never; YAML ".inf").
	ImbalancedThreshold *float64 `yaml:"imbalanced_threshold"`
	// MatchRateThreshold: match rate at or above it routes to the best
	// match (default 0.1).
	MatchRateThreshold *float64 `yaml:"match_rate_threshold"`
}

// SessionConfig configures consistent hashing on the session key.
type SessionConfig struct {
	// VirtualNodes per replica on the ring (default 160).
	VirtualNodes int `yaml:"virtual_nodes"`
	// BoundedLoadFactor c: a replica with more than c times the mean
	// request load is skipped along the ring; 0 turns bounding off
	// (default). When set it must be >= 1.
	BoundedLoadFactor float64 `yaml:"bounded_load_factor"`
}

// Defaults.
const (
	DefaultOverlapScoreCredit  = 1.0
	DefaultPrefillLoadScale    = 1.0
	DefaultHostCacheHitWeight  = 0.75
	DefaultDiskCacheHitWeight  = 0.25
	DefaultCacheThreshold      = 0.3
	DefaultBalanceAbsThreshold = 64
	DefaultBalanceRelThreshold = 1.5
	DefaultMatchRateThreshold  = 0.1
	DefaultVirtualNodes        = 160
)

// Float returns a pointer to v, for setting Config knobs in code.
func Float(v float64) *float64 { return &v }

func orDefault(p *float64, def float64) float64 {
	if p == nil {
		return def
	}
	return *p
}

// Validate checks every section; the error names the first bad field.
func (c Config) Validate() error {
	if _, err := c.Blended.resolve(); err != nil {
		return err
	}
	if _, err := c.HardSwitch.resolve(); err != nil {
		return err
	}
	if _, err := c.PrefixAffinity.resolve(); err != nil {
		return err
	}
	if _, err := c.Session.resolve(); err != nil {
		return err
	}
	if _, err := c.Weighted.resolve(); err != nil {
		return err
	}
	if _, err := c.KVRoute.resolve(); err != nil {
		return err
	}
	return nil
}

// New returns the named policy built from its section of cfg, with defaults
// applied and validated.
func New(name string, cfg Config) (Policy, error) {
	switch name {
	case NameBlended:
		return NewBlended(cfg.Blended)
	case NameHardSwitch:
		return NewHardSwitch(cfg.HardSwitch)
	case NamePrefixAffinity:
		return NewPrefixAffinity(cfg.PrefixAffinity)
	case NameSession:
		return NewSession(cfg.Session)
	case NameLeastLoad:
		return LeastLoad{}, nil
	case NameRoundRobin:
		return &RoundRobin{}, nil
	case NameRandom:
		return Random{}, nil
	case NamePureAffinity:
		return PureAffinity{}, nil
	case NameWeighted:
		return NewWeighted(cfg.Weighted)
	case NameKVRoute:
		return NewKVRoute(cfg.KVRoute)
	}
	return nil, fmt.Errorf("%w: policy %q: unknown (want one of %v)", ErrConfig, name, Names())
}

func fieldErr(field string, v float64, want string) error {
	return fmt.Errorf("%w: %s: %v: must be %s", ErrConfig, field, v, want)
}

// finiteNonNeg validates a knob that must be a finite number >= 0.
func finiteNonNeg(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fieldErr(field, v, "a finite number >= 0")
	}
	return nil
}

// knob is a named value for validation.
type knob struct {
	name string
	v    float64
}

// allFiniteNonNeg validates knobs that must be finite numbers >= 0.
func allFiniteNonNeg(knobs ...knob) error {
	for _, k := range knobs {
		if err := finiteNonNeg(k.name, k.v); err != nil {
			return err
		}
	}
	return nil
}

// tierWeights resolves the per-tier credit weights (GPU 1, host and disk
// from the knobs or their defaults) and checks both lie in [0, 1], naming
// them <prefix>.host_cache_hit_weight and <prefix>.disk_cache_hit_weight.
func tierWeights(prefix string, host, disk *float64) ([index.NumTiers]float64, error) {
	var w [index.NumTiers]float64
	w[index.TierGPU] = 1
	w[index.TierCPU] = orDefault(host, DefaultHostCacheHitWeight)
	w[index.TierDisk] = orDefault(disk, DefaultDiskCacheHitWeight)
	if err := unit(prefix+".host_cache_hit_weight", w[index.TierCPU]); err != nil {
		return w, err
	}
	return w, unit(prefix+".disk_cache_hit_weight", w[index.TierDisk])
}

// unit validates a knob that must lie in [0, 1].
func unit(field string, v float64) error {
	if !(v >= 0 && v <= 1) {
		return fieldErr(field, v, "in [0, 1]")
	}
	return nil
}

// Compile-time checks that every policy implements Policy.
var (
	_ Policy = (*Blended)(nil)
	_ Policy = (*HardSwitch)(nil)
	_ Policy = (*PrefixAffinity)(nil)
	_ Policy = (*Session)(nil)
	_ Policy = LeastLoad{}
	_ Policy = (*RoundRobin)(nil)
	_ Policy = Random{}
	_ Policy = PureAffinity{}
	_ Policy = (*Weighted)(nil)
	_ Policy = (*KVRoute)(nil)
)
