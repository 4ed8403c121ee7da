-- Gives back the use a call took when its decision was then refused (someone decided it
-- first, or the run stopped waiting): a use is kept only by a recorded decision.
if redis.call('HDEL', uses_key, use_key) == 1 then
  redis.call('HINCRBY', grant_key, 'uses', -1)
  return 1
end
return 0
