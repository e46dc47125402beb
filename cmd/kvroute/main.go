// Command kvroute is the KV-cache-aware request router: an Envoy ext_proc
// service (serve), a client of its admin API (explain) and its version.
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "version", "--version", "-version":
		fmt.Println("kvroute", version)
		return 0
	case "help", "-h", "--help":
		usage()
		return 0
	}
	fmt.Fprintf(os.Stderr, "kvroute: unknown command %q\n", args[0])
	usage()
	return 2
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: kvroute <command> [flags]

commands:
  serve    --config kvroute.yaml   run the router (flags override the file)
  explain  -f request.json         explain a routing decision (admin API)
  version                          print the version
`)
}
