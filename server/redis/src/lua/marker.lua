-- Whether a resource's marker is still the one a replica knows, set by this
-- very Redis process (see limits.lua). A replica asks this of resources no
-- call has touched lately: when Redis lost them or went back in time, the
-- replica restores what it knows before anyone decides from a full bucket.
-- KEYS[1]: the marker; ARGV[1]: the token the replica knows.
-- Returns 1 when it is, 0 when it is not.
if marked(KEYS[1], ARGV[1]) then return 1 end
return 0
