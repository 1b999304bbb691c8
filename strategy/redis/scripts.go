package redis

import (
	_ "embed"

	goredis "github.com/redis/go-redis/v9"
)

// The Lua scripts: each is lua/base.lua, the shared files it needs
// (versions.lua for watches, buckets.lua for token buckets) and its own
// file. A script defines only the functions it uses: Redis runs a script's
// definitions at every call.
var (
	//go:embed lua/base.lua
	luaBase string
	//go:embed lua/versions.lua
	luaVersions string
	//go:embed lua/buckets.lua
	luaBuckets string
	//go:embed lua/push.lua
	luaPush string
	//go:embed lua/watch.lua
	luaWatch string
	//go:embed lua/take.lua
	luaTake string

	pushSource  = luaBase + luaVersions + luaBuckets + luaPush
	watchSource = luaBase + luaVersions + luaWatch
	takeSource  = luaBase + luaBuckets + luaTake

	pushScript  = goredis.NewScript(pushSource)
	watchScript = goredis.NewScript(watchSource)
	takeScript  = goredis.NewScript(takeSource)
)

// writes reports whether a command runs a script that writes (a push or a
// take, not a watch), which Options.WaitReplicas waits for.
func writes(c goredis.Cmder) bool {
	args := c.Args()
	if len(args) < 2 {
		return false
	}
	switch c.Name() {
	case "evalsha":
		sha, _ := args[1].(string)
		return sha == pushScript.Hash() || sha == takeScript.Hash()
	case "eval":
		src, _ := args[1].(string)
		return src == pushSource || src == takeSource
	}
	return false
}

// evalArgs returns the EVAL form of an EVALSHA command's arguments, for a
// re-send after NOSCRIPT (which proves the script did not run).
func evalArgs(args []any) []any {
	sha, _ := args[1].(string)
	src := pushSource
	switch sha {
	case watchScript.Hash():
		src = watchSource
	case takeScript.Hash():
		src = takeSource
	}
	return append([]any{"eval", src}, args[2:]...)
}
