"""mmrlvr.rewards"""
