package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// runExplain is `kvroute explain`: it sends a request body to a running
// kvroute's admin API and prints the decision.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvroute explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "request body file (OpenAI JSON; - for stdin)")
	var af adminFlags
	af.register(fs)
	path := fs.String("path", "", "request path (default: chat when the body has messages, else completions)")
	session := fs.String("session", "", "session affinity key (as x-session-id would carry it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("explain: -f request.json is required")
	}
	var body []byte
	var err error
	if *file == "-" {
		body, err = io.ReadAll(os.Stdin)
	} else {
		body, err = os.ReadFile(*file)
	}
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	var resp *kvroutev1.ExplainResponse
	err = callAdmin(ctx, af, func(ctx context.Context, c kvroutev1.AdminClient) (err error) {
		resp, err = c.Explain(ctx, &kvroutev1.ExplainRequest{Body: body, Path: *path, SessionKey: *session})
		return err
	})
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if af.json {
		return printJSON(stdout, resp)
	}
	return printExplain(stdout, resp)
}

// adminFlags are the flags of every command that calls a running
// kvroute's admin API.
type adminFlags struct {
	addr    string
	timeout time.Duration
	json    bool
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.addr, "addr", DefaultAdminAddr, "admin listener of the running kvroute")
	fs.DurationVar(&a.timeout, "timeout", 5*time.Second, "deadline of the call")
	fs.BoolVar(&a.json, "json", false, "print the raw answer as JSON")
}

// callAdmin calls a running kvroute's admin API at a.addr (plaintext gRPC:
// the admin listener is on loopback unless tls.admin protects it) within
// a.timeout.
func callAdmin(ctx context.Context, a adminFlags, call func(context.Context, kvroutev1.AdminClient) error) error {
	cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return call(ctx, kvroutev1.NewAdminClient(cc))
}

// printJSON writes an admin API answer as its JSON mapping (proto field
// names, every field).
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// printExplain writes a decision as a header and one table row per
// candidate.
func printExplain(w io.Writer, r *kvroutev1.ExplainResponse) error {
	fmt.Fprintf(w, "pick:     %s (%s)\n", r.GetReplica(), r.GetAddress())
	fmt.Fprintf(w, "policy:   %s, reason %s", r.GetPolicy(), r.GetReason())
	if r.GetDegraded() != "" {
		fmt.Fprintf(w, ", degraded: %s", r.GetDegraded())
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "prompt:   %d tokens, %d blocks (tokens from %s in %dµs; decided in %dµs)\n",
		r.GetPromptTokens(), r.GetPromptBlocks(), r.GetTokenSource(), r.GetTokenizeMicros(), r.GetDecideMicros())
	if m, e := r.GetMaxTokens(), r.GetExpectedOutputTokens(); m > 0 || e > 0 {
		mt := "none"
		if m > 0 {
			mt = fmt.Sprint(m)
		}
		fmt.Fprintf(w, "output:   max_tokens %s, %d tokens expected\n", mt, e)
	}
	if len(r.GetFallbacks()) > 0 {
		fmt.Fprintf(w, "fallback: %s\n", strings.Join(r.GetFallbacks(), ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tREPLICA\tADDRESS\tINDEX\tGPU\tCPU\tDISK\tCREDIT\tPREFILL\tDECODE\tRUN\tWAIT\tKV%\tCOST\t")
	for _, c := range r.GetCandidates() {
		mark := ""
		switch {
		case c.GetPicked():
			mark = "*"
		case !c.GetEligible():
			mark = "x"
		}
		if c.GetHome() {
			mark += "h"
		}
		src := "events"
		if c.GetApproximate() {
			src = "approx"
		}
		l := c.GetLoad()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.2f\t%.0f\t%.0f\t%d\t%d\t%.0f\t%s\t\n",
			mark, c.GetReplica(), c.GetAddress(), src,
			c.GetMatched().GetGpu(), c.GetMatched().GetCpu(), c.GetMatched().GetDisk(),
			c.GetCredit(), l.GetActivePrefillBlocks(), l.GetActiveDecodeBlocks(),
			l.GetActiveRequests(), l.GetWaitingRequests(), 100*l.GetKvUsage(), cost(c.GetCost()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n* picked   x ineligible (unhealthy, outside the subset, or another model)   h the session's home (served its previous request)\nINDEX: events = matched against the engine-event index; approx = the dispatch-learned index (replica without events)")
	return err
}

func cost(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
