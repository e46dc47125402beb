// Package tlsfiles serves TLS (and mutual TLS) from certificate files that
// may change while the process runs.
//
// Config names a server certificate and key (PEM) and, optionally, a CA
// bundle: with the CA set, every client must present a certificate that
// chains to it (mutual TLS), and a client without one is refused at the
// handshake. Files returns a *tls.Config whose GetConfigForClient re-reads
// the files when their size or modification time changed since the last
// load (checked at most once per Config.ReloadInterval, on a handshake: no
// goroutine, nothing to stop). A reload that fails (a half-written file)
// keeps serving the previous certificates and reports the error through
// the OnError callback; the next handshake after the interval tries again.
//
// Listen wraps a net.Listener so every accepted connection is TLS; ALPN
// offers h2 and http/1.1, so gRPC (HTTP/2) and plain HTTP servers both work
// on top of it.
package tlsfiles
