package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Errors of stores and of Publish and Rollback.
var (
	// ErrNoVersion is returned by Store.Get, SetCurrent and Rollback for a
	// version the store does not hold, and by Rollback when there is no
	// earlier version.
	ErrNoVersion = errors.New("policy: no such version")
)

// Version is one stored version of a policy document.
type Version struct {
	// Number identifies the version; numbers grow with each Append, from 1.
	Number int64
	// Doc is the document's text (YAML or JSON).
	Doc []byte
}

// Store keeps the versions of a policy document and which one is current.
// Every node of a cluster watches one Store (see Watcher). Implementations:
// MemoryStore (tests, one process), FileStore (a file),
// policy/redisstore and policy/pgstore (a cluster).
//
// An error from a Store means the store failed (unreachable, timed out); it
// never says anything about a document, which stores do not validate
// (Publish does).
type Store interface {
	// Current returns the number of the current version, 0 when there is
	// none. It is cheap: watchers poll it.
	Current(ctx context.Context) (int64, error)
	// Get returns version n, or ErrNoVersion.
	Get(ctx context.Context, n int64) (Version, error)
	// Versions lists the numbers of the versions held, ascending.
	Versions(ctx context.Context) ([]int64, error)
	// Append stores doc as a new version, makes it current and notifies
	// the watchers; it returns the version's number.
	Append(ctx context.Context, doc []byte) (int64, error)
	// SetCurrent makes version n current (a rollback) and notifies the
	// watchers; ErrNoVersion when the store does not hold n.
	SetCurrent(ctx context.Context, n int64) error
	// Subscribe returns a channel that receives a value, soon after, when
	// the current version may have changed. The channel is closed when the
	// subscription breaks or ctx ends; the watcher then subscribes again.
	// Notifications may be lost: watchers also poll Current. A store that
	// cannot notify returns a nil channel.
	Subscribe(ctx context.Context) (<-chan struct{}, error)
}

// Publish validates doc (it must parse, compile and pass check, when check
// is not nil) and appends it to store as the new current version. A bad
// document is refused with an error wrapping ErrInvalid and the store is
// left as it was.
func Publish(ctx context.Context, store Store, doc []byte, check func(*Snapshot) error) (int64, error) {
	s, err := Load(doc, 0, Options{})
	if err != nil {
		return 0, err
	}
	if check != nil {
		if err := check(s); err != nil {
			return 0, err
		}
	}
	return store.Append(ctx, doc)
}

// Rollback makes current the version before the current one (the highest
// number below it) and returns its number. ErrNoVersion when there is none.
// Use Store.SetCurrent to roll back to a given version.
func Rollback(ctx context.Context, store Store) (int64, error) {
	cur, err := store.Current(ctx)
	if err != nil {
		return 0, err
	}
	vs, err := store.Versions(ctx)
	if err != nil {
		return 0, err
	}
	i, _ := slices.BinarySearch(vs, cur)
	if i == 0 {
		return 0, fmt.Errorf("%w: nothing before version %d", ErrNoVersion, cur)
	}
	to := vs[i-1]
	return to, store.SetCurrent(ctx, to)
}
