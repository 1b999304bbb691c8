package redis

import (
	"errors"
	"net"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// refusals are the error codes with which Redis refuses a command before it
// runs it. Inside the push script they can only come from its first write,
// the SET NX of the batch-part id (Redis checks OOM, READONLY, MISCONF and
// NOREPLICAS at a script's first write and lets the rest of the script run),
// so they too mean that the part wrote nothing.
var refusals = map[string]bool{
	"NOSCRIPT": true, "READONLY": true, "LOADING": true, "MASTERDOWN": true,
	"BUSY": true, "CLUSTERDOWN": true, "TRYAGAIN": true, "CROSSSLOT": true,
	"OOM": true, "MISCONF": true, "NOREPLICAS": true, "NOAUTH": true,
	"NOPERM": true, "WRONGPASS": true, "MOVED": true, "ASK": true,
}

func isRedisError(err error) bool {
	var rerr goredis.Error
	return errors.As(err, &rerr)
}

func isNoScript(err error) bool {
	return errors.Is(err, goredis.ErrNoScript) || goredis.HasErrorPrefix(err, "NOSCRIPT")
}

// surelyNotApplied reports whether err, the error of one script call, proves
// that the call wrote nothing.
func (s *Store) surelyNotApplied(err error) bool {
	if errors.Is(err, strategy.ErrNotApplied) {
		return true
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if strings.HasPrefix(msg, "ERR max number of clients reached") {
			return true
		}
		code, _, _ := strings.Cut(msg, " ")
		return refusals[code]
	}
	// A connection that could not be had proves nothing was sent only when
	// the client made a single attempt: with retries, an earlier attempt of
	// the same command may have reached Redis before its connection broke.
	if !s.noRetries {
		return false
	}
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") ||
		errors.Is(err, goredis.ErrPoolTimeout) || errors.Is(err, goredis.ErrClosed)
}
