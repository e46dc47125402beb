package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildah runs buildah against the test's own storage.
type buildah struct {
	root, runroot string
}

func (b buildah) run(t *testing.T, args ...string) string {
	t.Helper()
	full := append([]string{"--root", b.root, "--runroot", b.runroot, "--storage-driver", "vfs"}, args...)
	cmd := exec.Command("buildah", full...)
	cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("buildah %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func TestImage(t *testing.T) {
	for _, tool := range []string{"buildah", "chroot", "readelf", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run make deps (hack/install-deps.sh installs what the image build needs)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("the image test mounts a root filesystem and needs root (as CI runs)")
	}
	dir := t.TempDir()
	b := buildah{root: filepath.Join(dir, "root"), runroot: filepath.Join(dir, "run")}
	version := fmt.Sprintf("test-%d", time.Now().UnixNano())
	tag := "kvroute/kvroute:" + version

	build := exec.Command("bash", "../../hack/image/build.sh", "-t", tag, "--root", b.root, "--runroot", b.runroot)
	build.Env = append(os.Environ(), "VERSION="+version, "COMMIT=0123456789abcdef")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("hack/image/build.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// vfs layers are plain directories; removing the storage
		// (t.TempDir) is enough once nothing is mounted.
		exec.Command("buildah", "--root", b.root, "--runroot", b.runroot, "--storage-driver", "vfs", "rm", "--all").Run()
	})

	var inspect struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
				Cmd        []string
				Labels     map[string]string
			} `json:"config"`
		}
	}
	if err := json.Unmarshal([]byte(b.run(t, "inspect", "--type", "image", tag)), &inspect); err != nil {
		t.Fatalf("inspect: %v", err)
	}
	cfg := inspect.OCIv1.Config
	if cfg.User != "65532:65532" {
		t.Errorf("image user = %q, want 65532:65532 (non-root)", cfg.User)
	}
	if strings.Join(cfg.Entrypoint, " ") != "/usr/local/bin/kvroute" {
		t.Errorf("entrypoint = %q", cfg.Entrypoint)
	}
	if strings.Join(cfg.Cmd, " ") != "serve --config /etc/kvroute/kvroute.yaml" {
		t.Errorf("cmd = %q", cfg.Cmd)
	}
	if got := cfg.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("version label = %q, want %q", got, version)
	}

	ctr := b.run(t, "from", tag)
	t.Cleanup(func() {
		exec.Command("buildah", "--root", b.root, "--runroot", b.runroot, "--storage-driver", "vfs", "umount", ctr).Run()
	})
	rootfs := b.run(t, "mount", ctr)

	// Nothing but the binary, its libraries and a few files under /etc: no
	// shell, no package manager, and nothing the runtime user may write.
	for _, p := range []string{"bin/sh", "usr/bin/sh", "bin/bash"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); err == nil {
			t.Errorf("image contains /%s", p)
		}
	}
	n := 0
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", path)
		}
		if st.Uid != 0 || info.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s is writable by the runtime user (owner %d, mode %v)", strings.TrimPrefix(path, rootfs), st.Uid, info.Mode())
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatalf("walk rootfs: %v", err)
	}
	if n > 60 {
		t.Errorf("rootfs has %d entries; expected only the binary, its libraries and /etc files", n)
	}

	// The binary runs from the image's root filesystem as the image's user,
	// with only the image's libraries to load.
	runIn := func(args ...string) (string, error) {
		cmd := exec.Command("chroot", append([]string{"--userspec=65532:65532", rootfs, "/usr/local/bin/kvroute"}, args...)...)
		cmd.Env = []string{"PATH=/usr/local/bin"}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := runIn("version")
	if err != nil {
		t.Fatalf("kvroute version in the image: %v\n%s", err, out)
	}
	if want := "kvroute " + version + "+0123456789abcdef"; strings.TrimSpace(out) != want {
		t.Errorf("kvroute version printed %q, want %q (the same stamp as make build)", out, want)
	}
	out, err = runIn("serve", "--help")
	if err != nil {
		t.Fatalf("kvroute serve --help in the image: %v\n%s", err, out)
	}
	if !strings.Contains(out, "-config") {
		t.Errorf("kvroute serve --help does not document -config:\n%s", out)
	}
}
