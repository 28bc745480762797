"""mmrlvr.data"""
