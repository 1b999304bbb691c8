package policy_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/storetest"
)

func TestFileStoreContract(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	storetest.Run(t, func(t *testing.T) storetest.Env {
		path := filepath.Join(t.TempDir(), "policy.yaml")
		f := policy.NewFileStore(path)
		return storetest.Env{Store: f, AppendQuietly: func(t *testing.T, doc []byte) int64 {
			// Another process edits the file: this store learns of it by
			// polling, and numbers it next.
			vs, err := f.Versions(context.Background())
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, doc, 0o644))
			return int64(len(vs) + 1)
		}}
	})
}

// TestFileStoreEdits follows a file replaced by an atomic rename and one
// edited in place (same size, so only the content hash tells), and keeps
// the last good version while the file is bad or missing.
func TestFileStoreEdits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "policy.yaml")
		require.NoError(t, os.WriteFile(path, storetest.Doc(100), 0o644))
		w, err := policy.NewWatcher(context.Background(), policy.NewFileStore(path),
			policy.WatchOptions{PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer w.Close()
		max := func() int64 { return w.Load().Document().Default.Limits[0].Max }
		require.EqualValues(t, 100, max())

		// Atomic rename.
		tmp := filepath.Join(dir, "new.yaml")
		require.NoError(t, os.WriteFile(tmp, storetest.Doc(200), 0o644))
		require.NoError(t, os.Rename(tmp, path))
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		require.EqualValues(t, 200, max())

		// In place, same size, perhaps the same modification time.
		fh, err := os.OpenFile(path, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fh.WriteAt(storetest.Doc(300), 0)
		require.NoError(t, err)
		require.NoError(t, fh.Close())
		time.Sleep(1100 * time.Millisecond) // ten polls: one hashes
		synctest.Wait()
		require.EqualValues(t, 300, max())

		// A bad document, then a missing file: the last good one stays.
		require.NoError(t, os.WriteFile(path, []byte("default: {limits: [{window: 1m, max: 0}]}"), 0o644))
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		require.EqualValues(t, 300, max())
		require.EqualValues(t, 1, w.Stats().Rejected)
		require.NoError(t, os.Remove(path))
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		require.EqualValues(t, 300, max())
		require.Positive(t, w.Stats().StoreErrors)

		// Back to an earlier content: that version's number again.
		require.NoError(t, os.WriteFile(path, storetest.Doc(200), 0o644))
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		require.EqualValues(t, 200, max())
		require.EqualValues(t, 2, w.Stats().Version)
	})
}
