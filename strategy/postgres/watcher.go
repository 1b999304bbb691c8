package postgres

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkWatcher refuses a pool whose connections react to a done context only
// after a delay: pgx then keeps waiting for the server for DeadlineDelay past
// the caller's deadline, and a silent server makes every call (a sync
// cycle's push, Close's flush) outlast its bound by that much. pgx's default
// handler has no delay. A handler of a type pgx does not define cannot be
// checked; it is accepted, and the bound is then the handler's.
func checkWatcher(pool *pgxpool.Pool) error {
	build := pool.Config().ConnConfig.BuildContextWatcherHandler
	if build == nil {
		return nil
	}
	var h ctxwatch.Handler
	func() {
		// The builder is the user's code, called here with a connection it
		// has not seen: a panic means "cannot check".
		defer func() { _ = recover() }()
		h = build(&pgconn.PgConn{})
	}()
	var delay time.Duration
	switch h := h.(type) {
	case *pgconn.DeadlineContextWatcherHandler:
		delay = h.DeadlineDelay
	case *pgconn.CancelRequestContextWatcherHandler:
		delay = h.DeadlineDelay
	}
	if delay > 0 {
		return fmt.Errorf("%w: the pool's ConnConfig.BuildContextWatcherHandler returns a %T with DeadlineDelay %v: "+
			"every call would wait that long past its context's deadline when the server is silent; set DeadlineDelay to 0",
			ErrInvalidPool, h, delay)
	}
	return nil
}
