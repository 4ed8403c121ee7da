-- Gives back the use a decision took when the decision was then refused.
return redis.call('HDEL', uses_key, use_key)
