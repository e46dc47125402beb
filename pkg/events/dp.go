package events

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/pkg/index"
)

// dpSep separates a replica ID from its data-parallel rank.
const dpSep = "#dp"

// DPReplicaID names rank's stream of replica id: id itself for rank 0,
// "<id>#dp<rank>" above.
func DPReplicaID(id index.ReplicaID, rank int) index.ReplicaID {
	if rank <= 0 {
		return id
	}
	return id + index.ReplicaID(dpSep+strconv.Itoa(rank))
}

// SplitDPReplicaID inverts DPReplicaID: it returns the replica ID and the
// rank (0 for an ID without a rank suffix).
func SplitDPReplicaID(id index.ReplicaID) (index.ReplicaID, int) {
	s := string(id)
	i := strings.LastIndex(s, dpSep)
	if i < 0 {
		return id, 0
	}
	r, err := strconv.Atoi(s[i+len(dpSep):])
	if err != nil || r <= 0 || strconv.Itoa(r) != s[i+len(dpSep):] {
		return id, 0
	}
	return index.ReplicaID(s[:i]), r
}

// DPSources expands base into one source per data-parallel rank, the way
// vLLM and SGLang offset their endpoints: tcp ports (event and replay) +
// rank, inproc names suffixed "_dp<rank>". A port of 0 or "*" is left as
// is. size <= 1 returns base alone.
func DPSources(base Source, size int) ([]Source, error) {
	if size <= 1 {
		return []Source{base}, nil
	}
	out := make([]Source, 0, size)
	for rank := range size {
		s := base
		s.ID = DPReplicaID(base.ID, rank)
		s.DPRank = rank
		var err error
		if s.Endpoint, err = offsetEndpoint(base.Endpoint, rank); err != nil {
			return nil, err
		}
		if base.ReplayEndpoint != "" {
			if s.ReplayEndpoint, err = offsetEndpoint(base.ReplayEndpoint, rank); err != nil {
				return nil, err
			}
		}
		out = append(out, s)
	}
	return out, nil
}

func offsetEndpoint(ep string, rank int) (string, error) {
	if rank == 0 {
		return ep, nil
	}
	switch {
	case strings.HasPrefix(ep, "inproc://"):
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	case strings.HasPrefix(ep, "tcp://"):
		u, err := url.Parse(ep)
		if err != nil {
			return "", fmt.Errorf("events: endpoint %q: %w", ep, err)
		}
		i := strings.LastIndex(ep, ":")
		port := ep[i+1:]
		if port == "*" || port == "0" {
			return ep, nil
		}
		p, err := strconv.Atoi(port)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("events: endpoint %q has no numeric port", ep)
		}
		if p+rank > 65535 {
			return "", fmt.Errorf("events: endpoint %q: port %d + rank %d overflows", ep, p, rank)
		}
		return ep[:i+1] + strconv.Itoa(p+rank), nil
	}
	return "", fmt.Errorf("events: endpoint %q: cannot offset for data-parallel rank %d (want tcp:// or inproc://)", ep, rank)
}
