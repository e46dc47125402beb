package tokenize

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Where the auto kind looks for a model's tokenizer files
// (tokenizer.json and tokenizer_config.json, both required), in order:
//
//  1. each of Config.SearchDirs, as <dir>/<model> (the served model name
//     as a relative path, e.g. /models/Qwen/Qwen3-8B) and then
//     <dir>/<last element of the model name> (/models/Qwen3-8B);
//  2. the HuggingFace hub cache, as huggingface_hub lays it out:
//     <hub>/models--<org>--<name>/snapshots/<revision>/, the revision
//     refs/main names (else the most recently modified snapshot), where
//     <hub> is $HF_HUB_CACHE, else $HF_HOME/hub, else
//     ~/.cache/huggingface/hub.
//
// A model name that is not a local relative path (absolute, "..", empty
// elements) is never looked up in a directory: the name comes from the
// request.

// tokenizerFileNames are the files a directory must hold.
var tokenizerFileNames = [2]string{"tokenizer.json", "tokenizer_config.json"}

// FindTokenizerFiles returns the directory holding model's tokenizer files
// (see above), or "" when none does.
func FindTokenizerFiles(model string, searchDirs []string) string {
	if !safeModelPath(model) {
		return ""
	}
	for _, d := range searchDirs {
		cands := []string{filepath.Join(d, filepath.FromSlash(model))}
		if base := path.Base(model); base != model {
			cands = append(cands, filepath.Join(d, base))
		}
		for _, c := range cands {
			if hasTokenizerFiles(c) {
				return c
			}
		}
	}
	if hub := hfHubCache(); hub != "" {
		if dir := hfSnapshot(hub, model); dir != "" {
			return dir
		}
	}
	return ""
}

// safeModelPath: a non-empty relative slash path without "." or ".."
// elements or back slashes.
func safeModelPath(model string) bool {
	if model == "" || strings.ContainsAny(model, "\\\x00") || !filepath.IsLocal(filepath.FromSlash(model)) {
		return false
	}
	for _, e := range strings.Split(model, "/") {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	return true
}

func hasTokenizerFiles(dir string) bool {
	for _, f := range tokenizerFileNames {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// hfHubCache is the HuggingFace hub cache directory ("" if unknown).
func hfHubCache() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "huggingface", "hub")
	}
	return ""
}

// hfSnapshot finds model ("org/name") in a hub cache: the snapshot
// refs/main points at, else the newest snapshot with the files.
func hfSnapshot(hub, model string) string {
	repo := filepath.Join(hub, "models--"+strings.ReplaceAll(model, "/", "--"))
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err == nil {
		rev := strings.TrimSpace(string(ref))
		if safeModelPath(rev) && !strings.Contains(rev, "/") {
			if dir := filepath.Join(repo, "snapshots", rev); hasTokenizerFiles(dir) {
				return dir
			}
		}
	}
	ents, err := os.ReadDir(filepath.Join(repo, "snapshots"))
	if err != nil {
		return ""
	}
	type snap struct {
		dir   string
		mtime int64
	}
	var snaps []snap
	for _, e := range ents {
		dir := filepath.Join(repo, "snapshots", e.Name())
		if !hasTokenizerFiles(dir) {
			continue
		}
		st, err := os.Stat(dir)
		if err != nil {
			continue
		}
		snaps = append(snaps, snap{dir, st.ModTime().UnixNano()})
	}
	if len(snaps) == 0 {
		return ""
	}
	return slices.MaxFunc(snaps, func(a, b snap) int {
		if a.mtime != b.mtime {
			return int(min(max(a.mtime-b.mtime, -1), 1))
		}
		return strings.Compare(a.dir, b.dir)
	}).dir
}
