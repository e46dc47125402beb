package discovery

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults of the sources' configs, written once (DefaultPortName is
// beside the other port names).
const (
	DefaultFileInterval          = 5 * time.Second
	DefaultDNSInterval           = 10 * time.Second
	DefaultKubernetesMinInterval = time.Second
)

// Config is the "replicas" section of kvroute's config file: exactly one
// replica source. Each source's struct is the one its constructor takes
// (FileConfig, DNSConfig, KubernetesConfig), so a setting has one name from
// the file to the source.
type Config struct {
	// Static lists the replicas inline.
	Static []ReplicaSpec `yaml:"static"`
	// File is a replica file (the same list under a top-level "replicas:"
	// key), reloaded when it changes.
	File *FileConfig `yaml:"file"`
	// DNS resolves a name (A/AAAA or SRV) at an interval.
	DNS *DNSConfig `yaml:"dns"`
	// Kubernetes watches EndpointSlices (of a Service, or by selector) or
	// an InferencePool's Pods; the API client is in-cluster, or from
	// $KUBECONFIG outside a cluster.
	Kubernetes *KubernetesConfig `yaml:"kubernetes"`
}

// WithDefaults returns c with the chosen source's defaults applied (a
// Kubernetes namespace defaults to $POD_NAMESPACE). c's sources are copied,
// never modified.
func (c Config) WithDefaults() Config {
	if c.File != nil {
		f := c.File.WithDefaults()
		c.File = &f
	}
	if c.DNS != nil {
		d := c.DNS.WithDefaults()
		c.DNS = &d
	}
	if c.Kubernetes != nil {
		k := c.Kubernetes.WithDefaults()
		if k.Namespace == "" {
			k.Namespace = os.Getenv("POD_NAMESPACE")
		}
		c.Kubernetes = &k
	}
	return c
}

// Validate reports every problem, each a *FieldError (matching ErrInvalid)
// prefixed with its YAML path within the section ("static[2].address: ...",
// "kubernetes.namespace: ..."). A problem of the section as a whole (no
// source, or several) has an empty path.
func (c Config) Validate() error {
	var errs []error
	sources := 0
	if len(c.Static) > 0 {
		sources++
		if _, err := BuildReplicas("static", c.Static); err != nil {
			errs = append(errs, err)
		}
	}
	if c.File != nil {
		sources++
		errs = append(errs, c.File.check("file.")...)
	}
	if c.DNS != nil {
		sources++
		errs = append(errs, c.DNS.check("dns.")...)
	}
	if c.Kubernetes != nil {
		sources++
		errs = append(errs, c.Kubernetes.check("kubernetes.")...)
	}
	switch {
	case sources == 0:
		errs = append(errs, &FieldError{"", "one of static, file, dns or kubernetes is required"})
	case sources > 1:
		errs = append(errs, &FieldError{"", "set only one of static, file, dns or kubernetes"})
	}
	return errors.Join(errs...)
}

// NewSource builds the configured source (c validated), with log and reg
// for its logs and metrics. It starts nothing; for Kubernetes it builds the
// API clients (in-cluster, or from $KUBECONFIG) without calling the API.
func (c Config) NewSource(log *slog.Logger, reg prometheus.Registerer) (Source, error) {
	switch {
	case len(c.Static) > 0:
		rs, err := BuildReplicas("static", c.Static)
		if err != nil {
			return nil, err
		}
		return Static(rs), nil
	case c.File != nil:
		fc := *c.File
		fc.Logger, fc.Registerer = log, reg
		return NewFile(fc)
	case c.DNS != nil:
		dc := *c.DNS
		dc.Logger, dc.Registerer = log, reg
		return NewDNS(dc)
	case c.Kubernetes != nil:
		kc := *c.Kubernetes
		rc, err := kubeConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
		if kc.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
		if kc.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
		kc.Logger, kc.Registerer = log, reg
		return NewKubernetes(kc)
	}
	return nil, errors.New("no replica source")
}

// kubeConfig is the in-cluster API config, or $KUBECONFIG's outside one.
func kubeConfig() (*rest.Config, error) {
	c, err := rest.InClusterConfig()
	if err == nil {
		return c, nil
	}
	if path := os.Getenv("KUBECONFIG"); path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return nil, fmt.Errorf("not in a cluster and KUBECONFIG is unset: %w", err)
}
