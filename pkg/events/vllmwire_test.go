package events

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// vllmWire is the output of testdata/vllmwire/gen.py: batches encoded by
// vLLM's own msgspec structs.
type vllmWire struct {
	Version     string              `json:"vllm_version"`
	Fields      map[string][]string `json:"fields"`
	BatchFields []string            `json:"batch_fields"`
	Cases       []struct {
		Name string `json:"name"`
		Hex  string `json:"hex"`
	} `json:"cases"`
}

const vllmWireGolden = "testdata/vllmwire/vllm-0.33.0.json"

func readWire(t *testing.T, b []byte) vllmWire {
	t.Helper()
	var w vllmWire
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// wantWire is what each generated case must decode to (see gen.py).
func wantWire() map[string]Batch {
	const (
		wh1 = uint64(0x1e0b2e028ef071cb)
		wh2 = uint64(0xefad121d154ab2d6)
	)
	// Bytes hashes: the last 8 bytes of the digest, big-endian.
	d1, d2 := uint64(0x18191a1b1c1d1e1f), uint64(0x38393a3b3c3d3e3f)
	toks8 := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	full := Event{
		Type: EventBlockStored, Hashes: []uint64{wh1, wh2}, Tokens: toks8, BlockSize: 4, Medium: "GPU",
		LoRAName: "sql-lora",
		ExtraKeys: [][]ExtraKey{
			{{Kind: ExtraString, Str: "sql-lora"}, {Kind: ExtraMM, Str: "img-1", Int: -2}, {Kind: ExtraString, Str: "salt-1"}},
			{{Kind: ExtraString, Str: "sql-lora"}},
		},
		GroupIdx: 1, SpecKind: "sink_full_attention", SlidingWindow: 128, Locality: "REMOTE", Ownership: "kvcr",
		SessionID: "sess-1", Lookahead: [][]uint32{{9, 10}, {11, 12}},
	}
	minimal := Event{Type: EventBlockStored, Hashes: []uint64{wh1}, HasParent: true, Parent: wh2, Tokens: toks8[:4], BlockSize: 4, GroupIdx: -1}
	byteHashes := Event{
		Type: EventBlockStored, Hashes: []uint64{d1, d2}, HasParent: true, Parent: d1, Tokens: toks8, BlockSize: 4,
		Medium: "CPU", ExtraKeys: [][]ExtraKey{nil, {{Kind: ExtraBin, Bytes: []byte{1, 2}}}}, GroupIdx: -1,
	}
	sliding := Event{
		Type: EventBlockStored, Hashes: []uint64{wh1}, Tokens: []uint32{7, 7, 7, 7}, BlockSize: 4, Medium: "CPU",
		GroupIdx: 2, SpecKind: "sliding_window", SlidingWindow: 4096, Locality: "LOCAL",
	}
	removedFull := Event{Type: EventBlockRemoved, Hashes: []uint64{wh2}, Medium: "CPU", GroupIdx: 2, Locality: "LOCAL", Ownership: "kvcr"}
	removedMin := Event{Type: EventBlockRemoved, Hashes: []uint64{wh1, wh2}, Medium: "GPU", GroupIdx: -1}
	cleared := Event{Type: EventAllBlocksCleared, GroupIdx: -1}
	one := func(ev Event) Batch { return Batch{TS: ts, DPRank: 0, Events: []Event{ev}} }
	return map[string]Batch{
		"stored_every_field":          one(full),
		"stored_required_only":        one(minimal),
		"stored_bytes_hashes":         one(byteHashes),
		"stored_sliding_window_group": one(sliding),
		"removed_every_field":         one(removedFull),
		"removed_required_only":       one(removedMin),
		"cleared":                     one(cleared),
		"mixed_dp_rank_3":             {TS: ts, DPRank: 3, Events: []Event{minimal, removedMin, cleared}},
		"rank_unset":                  {TS: ts, DPRank: -1, Events: []Event{removedMin}},
	}
}

// checkWire decodes every case of w and checks the struct fields vLLM
// declares are exactly the fields the decoder knows, in the same order
// (the positional order of the array era is the declaration order).
func checkWire(t *testing.T, w vllmWire) {
	t.Helper()
	if d := cmp.Diff(append([]string(nil), storedFields...), w.Fields["BlockStored"]); d != "" {
		t.Errorf("vLLM %s BlockStored fields differ from the decoder's (-decoder +vLLM):\n%s", w.Version, d)
	}
	if d := cmp.Diff(append([]string(nil), removedFields...), w.Fields["BlockRemoved"]); d != "" {
		t.Errorf("vLLM %s BlockRemoved fields differ from the decoder's (-decoder +vLLM):\n%s", w.Version, d)
	}
	if len(w.Fields["AllBlocksCleared"]) != 0 || !slices.Equal(w.BatchFields, []string{"ts", "events", "data_parallel_rank"}) {
		t.Errorf("vLLM %s: AllBlocksCleared %v, batch %v", w.Version, w.Fields["AllBlocksCleared"], w.BatchFields)
	}
	for _, f := range append(slices.Clone(w.Fields["BlockStored"]), w.Fields["BlockRemoved"]...) {
		if !knownField(f) {
			t.Errorf("vLLM %s field %q is not handled by the decoder", w.Version, f)
		}
	}
	want := wantWire()
	if len(w.Cases) != len(want) {
		t.Errorf("%d cases, want %d", len(w.Cases), len(want))
	}
	for _, c := range w.Cases {
		p, err := hex.DecodeString(c.Hex)
		if err != nil {
			t.Fatal(err)
		}
		b, err := DecodeBatch(p, HashVLLM)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if b.Invalid != 0 || b.Unknown != 0 || b.UnknownKeys != 0 {
			t.Errorf("%s: invalid %d, unknown %d, unknown keys %d", c.Name, b.Invalid, b.Unknown, b.UnknownKeys)
		}
		b.Invalid, b.Unknown, b.UnknownKeys = 0, 0, 0
		if d := cmp.Diff(want[c.Name], b, cmpEvents); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.Name, d)
		}
		for n := range len(p) {
			if _, err := DecodeBatch(p[:n], HashVLLM); err == nil {
				t.Fatalf("%s: prefix of %d bytes decoded without error", c.Name, n)
			}
		}
	}
}

// The committed frames, produced by vLLM 0.33.0's structs (gen.py).
func TestVLLMWireGolden(t *testing.T) {
	raw, err := os.ReadFile(vllmWireGolden)
	if err != nil {
		t.Fatal(err)
	}
	w := readWire(t, raw)
	if w.Version != "0.33.0" {
		t.Fatalf("golden is from vLLM %s", w.Version)
	}
	checkWire(t, w)
}

// The frames are produced now by the installed vLLM's own structs (loaded
// without torch). A vLLM release that adds a field or changes the encoding
// fails here. Needs python3 with msgspec and vllm (pip install --no-deps
// vllm msgspec pyzmq); without them the test is skipped, unless
// KVROUTE_VLLM_WIRE=require.
func TestVLLMWireConformance(t *testing.T) {
	py, err := exec.LookPath("python3")
	need := os.Getenv("KVROUTE_VLLM_WIRE") == "require"
	if err != nil {
		if need {
			t.Fatal("python3 not found")
		}
		t.Skip("python3 not found")
	}
	probe := exec.Command(py, "-c", "import importlib.util as u, msgspec; import sys; sys.exit(u.find_spec('vllm') is None)")
	if err := probe.Run(); err != nil {
		if need {
			t.Fatalf("python3 lacks msgspec or vllm: %v", err)
		}
		t.Skip("python3 lacks msgspec or vllm (pip install --no-deps vllm msgspec pyzmq)")
	}
	cmd := exec.Command(py, filepath.Join("testdata", "vllmwire", "gen.py"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gen.py: %v\n%s", err, stderr.String())
	}
	t.Logf("gen.py ran in %v", time.Since(start).Round(time.Millisecond))
	live := readWire(t, out)
	checkWire(t, live)
	golden, err := os.ReadFile(vllmWireGolden)
	if err != nil {
		t.Fatal(err)
	}
	if g := readWire(t, golden); g.Version == live.Version {
		if d := cmp.Diff(g, live); d != "" {
			t.Errorf("vLLM %s now encodes differently from the committed frames (-committed +now):\n%s", live.Version, d)
		}
	} else {
		t.Logf("installed vLLM is %s, committed frames are from %s: compared fields and decoding only", live.Version, g.Version)
	}
}

// The every-field store applied: sink_full_attention is indexed, REMOTE
// puts it at the disk tier, and the keys fold in the lookahead tokens, the
// salt and the multimodal item, under the adapter's root.
func TestVLLMWireApply(t *testing.T) {
	w := readWire(t, must(os.ReadFile(vllmWireGolden)))
	var p []byte
	for _, c := range w.Cases {
		if c.Name == "stored_every_field" {
			p = must(hex.DecodeString(c.Hex))
		}
	}
	idx := index.New(index.Config{})
	st := applyPayload(t, idx, Target{Replica: "r", Model: "m", BlockSize: 4}, p)
	if st.StoredBlocks != 2 || st.OtherGroup != 0 {
		t.Fatalf("stats %+v", st)
	}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 11, 12}
	mm := ExtraBytes(nil, []ExtraKey{{Kind: ExtraMM, Str: "img-1", Int: -2}})
	opts, n := kvblock.Options{CacheSalt: "salt-1", Extras: [][]byte{mm}}.WithLookahead(prompt, 4, 2)
	// Block 0's lookahead is [5, 6] in this prompt but [9, 10] in the
	// event (the generator's values are arbitrary): only the event's own
	// lookahead tokens meet its keys.
	if got := matchOf(idx, kvblock.Keys(nil, kvblock.Root("m", "sql-lora"), prompt[:n], 4, opts), "r"); got != 0 {
		t.Fatalf("a prompt with other lookahead tokens matched %d blocks", got)
	}
	ev := wantWire()["stored_every_field"].Events[0]
	o := StoredOptions(&ev, nil)
	keys := kvblock.Keys(nil, kvblock.Root("m", "sql-lora"), ev.Tokens, 4, o)
	for _, m := range idx.Match(keys, nil) {
		if m.Replica == "r" && (m.Blocks != 2 || m.ByTier[index.TierDisk] != 2) {
			t.Fatalf("match %+v", m)
		}
	}
	if matchOf(idx, keys, "r") != 2 {
		t.Fatal("event keys not indexed")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// vLLM's own ZmqEventPublisher (publisher.py) holds 10,000 batches that no
// subscriber saw, and keeps publishing; a router started now (a restart)
// relearns the engine's whole cache from the replay and follows the live
// stream. Its view equals the one built from every payload the publisher
// sent. Needs what TestVLLMWireConformance needs, plus pyzmq.
func TestVLLMPublisherWarmRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 10,000 batches")
	}
	py, err := exec.LookPath("python3")
	need := os.Getenv("KVROUTE_VLLM_WIRE") == "require"
	if err == nil {
		err = exec.Command(py, "-c", "import importlib.util as u, msgspec, zmq; import sys; sys.exit(u.find_spec('vllm') is None)").Run()
	}
	if err != nil {
		if need {
			t.Fatalf("python3 with msgspec, pyzmq and vllm: %v", err)
		}
		t.Skip("python3 lacks msgspec, pyzmq or vllm")
	}
	const n = 10000
	dir := t.TempDir()
	ipc, logPath := filepath.Join(dir, "pub.sock"), filepath.Join(dir, "payloads.hex")
	cmd := exec.Command(py, filepath.Join("testdata", "vllmwire", "publisher.py"), ipc, logPath, fmt.Sprint(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("publisher stderr:\n%s", stderr.String())
		}
	})
	lines := bufio.NewScanner(stdout)
	line := func() string {
		if !lines.Scan() {
			t.Fatalf("publisher ended: %v\n%s", lines.Err(), stderr.String())
		}
		return lines.Text()
	}
	var replayEP string
	if _, err := fmt.Sscanf(line(), "ready %s", &replayEP); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	h := newHarness(t, testConfig(), Source{ID: "r1", Model: "m", Endpoint: "ipc://" + ipc, ReplayEndpoint: replayEP, Topic: "kv@t@m", BlockSize: 4})
	eventually(t, "caught up by replay", func() error {
		if st := h.m.Status("r1"); !st.CaughtUp {
			return fmt.Errorf("not caught up: %+v", st)
		}
		return nil
	})
	affinity := time.Since(start)
	t.Logf("vLLM publisher, %d buffered batches: cache affinity %v after the router started (%v partial rounds)",
		n, affinity.Round(time.Millisecond), h.counter("kvroute_events_replays_total", "result", "partial"))

	if _, err := io.WriteString(stdin, "stop\n"); err != nil {
		t.Fatal(err)
	}
	if got := line(); got != "stopped" {
		t.Fatalf("publisher said %q", got)
	}
	// The reference: every payload the publisher sent, applied in order.
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ref := index.New(index.Config{})
	ap := NewApplier(ref)
	var roots [][]uint32
	payloads := strings.Fields(string(raw))
	for _, hx := range payloads {
		b, err := DecodeBatch(must(hex.DecodeString(hx)), HashVLLM)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			if ev.Type == EventBlockStored && !ev.HasParent {
				roots = append(roots, slices.Clone(ev.Tokens))
			}
		}
		ap.Apply(Target{Replica: "r1", Model: "m", BlockSize: 4}, &b)
	}
	if len(payloads) <= n {
		t.Fatalf("publisher logged %d batches", len(payloads))
	}
	root := kvblock.Root("m", "")
	eventually(t, "view equals the engine's", func() error {
		st := h.m.Status("r1")
		if !st.HasSeq || st.LastSeq != uint64(len(payloads)-1) || !st.CaughtUp {
			return fmt.Errorf("status %+v, want last seq %d", st, len(payloads)-1)
		}
		if got, want := h.idx.Stats().Engine, ref.Stats().Engine; got != want {
			return fmt.Errorf("engine hashes %d, reference %d", got, want)
		}
		for i, toks := range roots {
			keys := kvblock.Keys(nil, root, toks, 4, kvblock.Options{})
			if got, want := matchOf(h.idx, keys, "r1"), matchOf(ref, keys, "r1"); got != want {
				return fmt.Errorf("prompt %d: %d blocks, reference %d", i, got, want)
			}
		}
		return nil
	})
}
