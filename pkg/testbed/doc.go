// Package testbed starts the real kvroute stack on loopback for the
// end-to-end tests, the local demo (hack/demo) and kvbench live runs:
// simulated engines (enginesim), kvroute and Envoy, each a child process.
//
// Contract:
//   - Everything listens on 127.0.0.1. FreePort hands out ports that are
//     free when asked and never hands the same port out twice in one
//     process, so concurrently started children do not collide.
//   - A Group owns the children it starts: each runs in its own process
//     group, is killed by the kernel if the starting thread dies without
//     stopping it (Pdeathsig), and has one waiter goroutine that Stop or
//     Kill joins. Group.Stop stops every child in reverse start order
//     (SIGTERM, then SIGKILL after a grace period), joins them, then runs
//     the group's cleanups (removing socket directories). No goroutine
//     outlives Stop.
//   - Every child writes stdout and stderr to <name>.log in the group's
//     directory; Proc.Tail and Proc.Lines read it back.
//   - Start methods return once the child is ready by its own readiness
//     signal (enginesim /health, kvroute /readyz, Envoy /ready and its
//     health checker seeing every kvroute healthy), or an error naming
//     what was awaited and the tail of the child's log.
//   - RenderEnvoy derives an Envoy config from a template (envoy/envoy.yaml)
//     by editing its YAML structure (listener, admin, ext_proc and fallback
//     cluster endpoints, an optional response header naming the upstream,
//     or no ext_proc filter at all for a plain round-robin Envoy), so the
//     template's documented ports and comments are not text-patched.
//
// The package has no test-framework dependency; callers adapt errors to
// testing.T themselves.
package testbed
