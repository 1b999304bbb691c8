package policy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// FileStore is a Store on one file, for a node whose policy is deployed as a
// file (a ConfigMap, a config-management run, an editor). Current notices a
// change of the file however it was made: an atomic rename, or an edit in
// place (the file, its modification time or its size changes; every tenth
// call also hashes the content, which catches an edit within the file
// system's timestamp granularity that keeps the size). A half-written
// file is simply a bad version, refused by the watcher until the write ends.
//
// Versions are kept beside the file, in the directory PATH.versions (one
// file N.yaml per version), so that every process on the machine (a node,
// the CLI) numbers them alike and a restart keeps them; a version first seen
// in the file (an edit) is numbered by the first FileStore that reads it.
// When that directory cannot be written the versions are kept in memory only.
// Use redisstore or pgstore for a cluster.
type FileStore struct {
	path string

	mu       sync.Mutex
	versions map[int64][]byte           // GUARDED_BY(mu)
	byHash   map[[32]byte]int64         // GUARDED_BY(mu)
	top      int64                      // GUARDED_BY(mu): the highest number
	current  int64                      // GUARDED_BY(mu)
	last     os.FileInfo                // GUARDED_BY(mu): of the file last read
	calls    int                        // GUARDED_BY(mu)
	subs     map[chan struct{}]struct{} // GUARDED_BY(mu)
}

var _ Store = (*FileStore)(nil)

// NewFileStore returns a FileStore on path. The file need not exist yet.
func NewFileStore(path string) *FileStore {
	return &FileStore{path: path, versions: map[int64][]byte{}, byHash: map[[32]byte]int64{}, subs: map[chan struct{}]struct{}{}}
}

// Current implements Store: it reads the file when it may have changed. A
// missing file is an error (the watcher keeps the policy in force).
func (f *FileStore) Current(context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		return 0, fmt.Errorf("policy: file store: %w", err)
	}
	f.calls++
	if f.current != 0 && f.unchanged(fi) && f.calls%10 != 0 {
		return f.current, nil
	}
	doc, err := os.ReadFile(f.path)
	if err != nil {
		return 0, fmt.Errorf("policy: file store: %w", err)
	}
	f.last = fi
	f.current = f.remember(doc)
	return f.current, nil
}

// unchanged reports whether fi looks like the file last read: the same file
// (a rename makes another), modification time and size. It requires f.mu.
func (f *FileStore) unchanged(fi os.FileInfo) bool {
	return f.last != nil && os.SameFile(fi, f.last) && fi.ModTime().Equal(f.last.ModTime()) && fi.Size() == f.last.Size()
}

// remember returns doc's version number, numbering (and keeping) it if new.
// It requires f.mu.
func (f *FileStore) remember(doc []byte) int64 {
	h := sha256.Sum256(doc)
	if n, ok := f.byHash[h]; ok {
		return n
	}
	f.scan() // another process may have kept it
	if n, ok := f.byHash[h]; ok {
		return n
	}
	dir := f.path + ".versions"
	for range 5 {
		n := f.top + 1
		err := os.MkdirAll(dir, 0o755)
		var fh *os.File
		if err == nil {
			fh, err = os.OpenFile(filepath.Join(dir, strconv.FormatInt(n, 10)+".yaml"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		}
		if errors.Is(err, fs.ErrExist) {
			f.scan() // another process took n
			continue
		}
		if err == nil {
			_, err = fh.Write(doc)
			if cerr := fh.Close(); err == nil {
				err = cerr
			}
		}
		_ = err // not writable: kept in memory only
		f.keep(n, doc, h)
		return n
	}
	f.keep(f.top+1, doc, h)
	return f.top
}

func (f *FileStore) keep(n int64, doc []byte, h [32]byte) {
	f.versions[n] = doc
	f.byHash[h] = n
	f.top = max(f.top, n)
}

// scan loads the versions kept beside the file. It requires f.mu.
func (f *FileStore) scan() {
	dir := f.path + ".versions"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n, err := strconv.ParseInt(strings.TrimSuffix(e.Name(), ".yaml"), 10, 64)
		if err != nil || n < 1 || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		if _, ok := f.versions[n]; ok {
			continue
		}
		doc, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		f.keep(n, doc, sha256.Sum256(doc))
	}
}

// Get implements Store.
func (f *FileStore) Get(_ context.Context, n int64) (Version, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	doc, ok := f.versions[n]
	if !ok {
		f.scan()
		if doc, ok = f.versions[n]; !ok {
			return Version{}, fmt.Errorf("%w: %d", ErrNoVersion, n)
		}
	}
	return Version{Number: n, Doc: doc}, nil
}

// Versions implements Store.
func (f *FileStore) Versions(context.Context) ([]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scan()
	return slices.Sorted(maps.Keys(f.versions)), nil
}

// Append implements Store: it replaces the file atomically (a temporary
// file renamed over it). A document equal to an earlier version gets that
// version's number.
func (f *FileStore) Append(_ context.Context, doc []byte) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write(doc); err != nil {
		return 0, err
	}
	f.current = f.remember(append([]byte(nil), doc...))
	f.notify()
	return f.current, nil
}

// SetCurrent implements Store: it writes version n back to the file.
func (f *FileStore) SetCurrent(_ context.Context, n int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scan()
	doc, ok := f.versions[n]
	if !ok {
		return fmt.Errorf("%w: %d", ErrNoVersion, n)
	}
	if err := f.write(doc); err != nil {
		return err
	}
	f.current = n
	f.notify()
	return nil
}

// write replaces the file atomically and records its stat. It requires f.mu.
func (f *FileStore) write(doc []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".*")
	if err != nil {
		return fmt.Errorf("policy: file store: %w", err)
	}
	_, err = tmp.Write(doc)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("policy: file store: %w", err)
	}
	if fi, err := os.Stat(f.path); err == nil {
		f.last = fi
	}
	return nil
}

// notify requires f.mu.
func (f *FileStore) notify() {
	for c := range f.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Subscribe implements Store: it notifies this FileStore's own Append and
// SetCurrent; changes made by others are found by polling.
func (f *FileStore) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	c := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs[c] = struct{}{}
	f.mu.Unlock()
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		delete(f.subs, c)
		f.mu.Unlock()
	})
	return c, nil
}
